"""What a vLLM 0.32 server's log says that start.sh and qualify.py compat read: the
prefill chunk it settled on at start, and the lines of a kernel compiled or tuned."""

from __future__ import annotations

import re

# How vLLM 0.32 says its prefill chunk at start (the only place it does).
CHUNK_LINES = re.compile(r"(?:Chunked prefill is enabled with max_num_batched_tokens=|"
                         r"max_num_scheduled_tokens is set to )([0-9]{1,7})")
COMPILE_LINES = re.compile(r"JIT compilation during inference|Compiling|autotun", re.I)


def logged_chunk(text: str) -> str:
    """The prefill chunk vLLM logged at start ("Chunked prefill is enabled with
    max_num_batched_tokens=N", or "max_num_scheduled_tokens is set to N"); '' if none."""
    found = CHUNK_LINES.findall(text)
    return found[-1] if found else ""
