"""The fake vLLM as a server process, as the tests start it (support.FAKE): fake_vllm.main()
from the module's cached bytecode, where `python3 fake_vllm.py` parses and compiles 1,300
lines at every start (about a quarter of a start's instructions, a few hundred starts a
suite run). It serves plain HTTP, so http.client's optional TLS is not loaded either."""

import sys

sys.modules.setdefault("ssl", None)          # http.server's import of http.client tries it
import fake_vllm  # noqa: E402

if __name__ == "__main__":
    sys.exit(fake_vllm.main())
