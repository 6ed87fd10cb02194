"""start.sh's launcher: start a vLLM server, guard its readiness, warm it up, report.

  main() -> start.settings.Settings(argv, env).check() (flags over START_* variables,
            all checked before anything is launched) -> start.steps.start() (or, with
            --rewarm, start.steps.rewarm()): launch, guard, warm up, OK or WARN, and with
            --supervise stay the server's parent and own its readiness (start.owner)

start.sh execs this file; its internals are start/ (the server, the steps, the settings).
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # the folder's packages
MODULES = ("start.processes", "start.server_command", "start.settings", "start.supervisor",
           "start.server", "start.owner", "start.steps", "tools.procfs", "tools.readback", "tools.ready",
           "core.readyfile", "core.textfile", "core.vllm_client", "core.plan_file")


def main(argv: list[str] | None = None, env: dict | None = None) -> int:
    """start.sh's exit status (see start.sh --help)."""
    argv = sys.argv[1:] if argv is None else argv
    try:                 # every module of the folder it uses, before anything is launched
        for module in MODULES:
            importlib.import_module(module)
    except ImportError as exc:                 # one line, no trace, nothing launched
        print(f"start.sh: cannot load {exc.name or exc}: offload/launch/ is copied and "
              f"rolled back as one folder; restore the whole folder", file=sys.stderr)
        return 2
    from start.server import Exit, Log
    from start.settings import Settings, Usage, build_parser
    from start.owner import Owner, ask_owner
    from start.steps import publish_start_outcome, rewarm, start, start_usage_error
    from core.sanitize import REDACTIONS
    settings = None
    try:
        settings = Settings(argv, dict(os.environ if env is None else env))
        REDACTIONS.secret(settings.env.get("VLLM_API_KEY"))   # no line of start.sh shows it
        if settings.help:
            print(build_parser().format_help(), end="")
            return 0
        settings.check()
        check_plan_file(settings.env.get("WARMUP_PLAN"))
    except Usage as exc:
        if settings is not None:          # no older success stays standing
            publish_start_outcome(settings, "warmup", 2, "usage", said=str(exc))
        return start_usage_error(str(exc))
    log = Log(settings.log_dir)
    try:
        return rewarm(settings, log, ask_owner) if settings.rewarm else \
            start(settings, log, Owner)
    except Exit as exc:
        return exc.code
    finally:
        if log.writer is not None:
            log.writer.flush(2.0)         # nobody reading: the exit below leaves without it


def check_plan_file(path: str | None) -> None:
    """A plan file WARMUP_PLAN names, read as the warm-up will: a wrong one is a usage
    error (start.settings.Usage) before anything is launched."""
    from core.plan_file import read_plan_file
    from core.transport import UsageError
    from start.settings import Usage
    if not path:
        return
    try:
        read_plan_file(path, "WARMUP_PLAN")
    except UsageError as exc:
        raise Usage(str(exc)) from None


if __name__ == "__main__":
    code = main()
    frame = sys.modules.get("core.runframe")      # absent only when the folder is not whole
    if frame is None:
        sys.exit(code)
    frame.script_exit(code)              # a stdout nobody reads cannot hold the exit
