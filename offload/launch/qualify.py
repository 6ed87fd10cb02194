#!/usr/bin/env python3
"""The coordinator's tools after a start: read records back, probe warmth, gate quality,
check health and readiness.

  qualify.py report FILE      what a records file shows, each run judged from its evidence
                              (tools/report.py)
  qualify.py probe ...        streamed requests timed to the first token, first round
                              against later rounds, per engine; every prompt new (tools/probe.py)
  qualify.py gate ...         exact-copy probes (six identifiers, an English and a Russian
                              passage), alone and batched, greedy (tools/gate.py)
  qualify.py health           one bounded GET /health (the check the launcher polls)
  qualify.py ready            is the ready file still true? the server it names answers
                              /health and is the same process serving the same model

main() finds the command in COMMANDS and imports its module only then (health and ready
live in tools/ready.py: a readiness probe loads qualify, tools/ready, tools/procfs and
core's transport, vllm_metrics and readyfile, nothing else). Its commands are tools/ (over
core/); never imports warmup.py.
The contract: CONTRACT.md beside this file.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
EXIT_PASS, EXIT_USAGE = 0, 2
MISSING = ("qualify.py: cannot load {}: offload/launch/ is copied and rolled back as one "
           "folder; restore the whole folder")

PROG = "qualify.py"
USAGE = """\
usage: qualify.py COMMAND [options]   (qualify.py COMMAND --help for each)

The coordinator's tools after a start:
  report FILE   what a records file shows, each run judged from its records: a pass
                needs every planned request record, judged again, on every engine
  probe         streamed (and --paths) requests timed to the first token, first round
                against later rounds, per engine: which paths a warm-up left cold
  gate          can the model copy text exactly? six identifiers and two passages,
                alone and batched; clean means no typo
  health        one bounded GET /health (exit 0 for 200, 1 another answer, 3 none)
  ready         is the ready file still true of the running server? (a readiness probe)
  compat        does a running vLLM still answer as this helper relies on? (before an
                upgrade: each route, metric, label and request field, held or missing)

The contract: CONTRACT.md beside this file."""


# main()

COMMANDS = {                          # name -> (module, its main); imported when it runs
    "report": ("tools.report", "report_main"), "probe": ("tools.probe", "probe_main"),
    "gate": ("tools.gate", "gate_main"), "health": ("tools.ready", "health_main"),
    "ready": ("tools.ready", "ready_main"), "compat": ("tools.compat", "compat_main"),
}


def main(argv: list[str] | None = None) -> int:
    as_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        if argv[:1] in (["-h"], ["--help"]):
            print(USAGE)
            return EXIT_PASS
        unknown = f"unknown command {ascii(argv[0][:40])}; " if argv else ""
        print(f"usage: {PROG} {{{','.join(COMMANDS)}}} ...  ({unknown}see {PROG} COMMAND "
              f"--help)", file=sys.stderr)
        return EXIT_USAGE
    module, function = COMMANDS[argv[0]]
    try:
        command = getattr(importlib.import_module(module), function)
        if as_process and "core.runframe" in sys.modules:   # a run: signals stay ignored
            sys.modules["core.runframe"].as_program()        # after its summary
    except ImportError as exc:           # a module of the folder is missing: one line, no trace
        print(MISSING.format(exc.name or exc), file=sys.stderr)
        return EXIT_USAGE
    try:
        return command(argv[1:])
    except SystemExit as exc:         # argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except ImportError as exc:        # one loaded for a record's need (a plan file's reader)
        print(MISSING.format(exc.name or exc), file=sys.stderr)
        return EXIT_USAGE


def script_exit(code: int) -> None:
    """Leave with `code`: through the run frame's exit when a run was loaded (a stdout
    nobody reads cannot hold it), else plainly (the readiness probe loads no run frame)."""
    frame = sys.modules.get("core.runframe")
    if frame is not None:
        frame.script_exit(code)
    sys.exit(code)


if __name__ == "__main__":
    script_exit(main())
