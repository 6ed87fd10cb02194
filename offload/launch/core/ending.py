"""An ending the warm-up could not publish or say itself, for warmup_serve.sh: a usage
error found before the helper started, or an end by the hard bound or a signal.

The wrapper runs publish_ending() in an interpreter of its own once the helper has
ended without exit 0 (the helper's own may be what hung); the warm-up never loads this.
"""

from __future__ import annotations

import os
import time

import core.runframe as runframe
from core.cli import EXIT_HARD_BOUND, EXIT_HARD_KILLED, emit, plug_in
from core.transport import UsageError


def publish_ending(argv: list[str], status: int, began: float, bound: float,
                   grace: int) -> None:
    """What warmup_serve.sh knows and the helper did not publish, in the textfile the
    command line or WARMUP_TEXTFILE names: a usage error found before the helper could
    start, or an ending by a signal or the bound (the helper KILLed, or TERMed before it
    could write), unless the textfile holds an ending published since `began`. Once the
    helper ran (`bound`, when the hard bound fell, not 0; `grace`, the wrapper's seconds
    from its TERM to its KILL), prints how it ended when it did not end by itself, for the
    wrapper to say."""
    textfile = runframe.textfile_of(argv)
    try:
        published = textfile and plug_in("core.textfile")
    except UsageError:                    # its code is missing: nothing can be published
        published = None
    if published and not published.ended_since(textfile, "offload_warmup", began):
        runframe.publish_usage("warmup", textfile, published.outcome_of_status(status), status)
    said = ending_said(status, bound, grace, os.environ.get("WARMUP_HARD_S", ""), time.time())
    if bound and said:
        emit(said)


def ending_said(status: int, bound: float, grace: int, hard: str, now: float) -> str | None:
    """How the helper ended when it did not end by itself (pure): the bound's TERM (124)
    or KILL (137 once the bound and its grace have passed), or a signal from elsewhere
    (the OOM killer, an operator's kill -9) that timeout passes on as 128+N."""
    if status == EXIT_HARD_BOUND:
        return f"warm-up ended by the hard bound (TERM at {hard} s, exit 124)"
    if status == EXIT_HARD_KILLED and now >= bound + grace:
        return f"warm-up killed by the hard bound (KILL at {hard}+{grace} s, exit 137)"
    if 128 < status < 160:
        return f"warm-up killed by signal {status - 128} (not the hard bound; exit {status})"
    return None
