"""A run's result published for monitoring: a node_exporter textfile (Prometheus text).

The run frame calls publish() after the summary when --textfile (WARMUP_TEXTFILE) names a
file, the launcher and its owner publish_outcome() for a start's outcomes: written whole
and atomically, with HELP and TYPE lines, base units, the `offload_` namespace and labels
only from our own vocabulary (nothing from a server, no secret). Another program's
samples there are kept, and so is the last success's time when this run did not pass.
"""

from __future__ import annotations

import math
import os
import time

from core.cli import EXIT_HARD_BOUND, EXIT_HARD_KILLED, EXIT_REFUSED, EXIT_USAGE, outcome
from core.files import open_regular, regular, write_atomically
from core.prometheus import parse_prometheus
from core.sanitize import json_number

# The verdicts a run ends with (custom: a custom plan passed), and the outcomes of a run that
# could not give one: a usage error, a server that never became healthy or could not be
# trusted (start.sh's), a start asked to skip the warm-up, and the two "not proven yet"
# states: start.sh starting a server, a run begun and not yet ended.
VERDICTS = ("pass", "custom", "fail", "refused", "killed", "usage", "not_started",
            "not_warmed", "starting", "running")
BEGUN = ("starting", "running")         # not ended: when it began is what is published
MAX_TEXTFILE_BYTES = 1 << 20


def outcome_of_status(status: int) -> str:
    """The name of a step that left no summary, from its exit status alone: 2 usage, 3
    refused, a signal's status (124, 137, 128+N) killed, anything else a failure (exit 0
    without a summary too: nothing ran)."""
    return {EXIT_USAGE: "usage", EXIT_REFUSED: "refused"}.get(
        status, "killed" if status in (EXIT_HARD_BOUND, EXIT_HARD_KILLED) or
        128 < status < 160 else "fail")


def result_samples(prefix: str, summary: dict, ended_at: float) -> list[tuple]:
    """The samples every run has: (name, labels, value, help); success only for the
    verdict 'pass' (contract.decide()'s: a custom plan is 'custom'). Pure."""
    verdict = outcome(summary.get("verdict"), summary.get("exit_code"))
    passed = verdict == "pass"
    if verdict in BEGUN:
        return [(f"{prefix}_last_run_started_timestamp_seconds", {}, ended_at,
                 "When the last run (or start.sh's start) began (Unix time)."),
                (f"{prefix}_last_run_success", {}, 0.0, "1 when the last run passed, else 0.")
                ] + verdict_samples(prefix, verdict)
    samples = [
        (f"{prefix}_last_run_timestamp_seconds", {}, ended_at,
         "When the last run ended (Unix time)."),
        (f"{prefix}_last_run_success", {}, 1.0 if passed else 0.0,
         "1 when the last run passed, else 0."),
        (f"{prefix}_last_run_duration_seconds", {}, float(summary.get("elapsed_s") or 0.0),
         "How long the last run took."),
        (f"{prefix}_last_run_exit_code", {}, float(summary.get("exit_code", 1)),
         "The last run's exit status (0 pass, 1 fail, 2 usage, 3 refused; 124/137 the "
         "wrapper's hard bound, 129/130/143 a signal)."),
    ]
    samples += verdict_samples(prefix, verdict)
    if passed:
        samples.append((f"{prefix}_last_success_timestamp_seconds", {}, ended_at,
                        "When a run last passed (Unix time); kept while later runs fail."))
    return samples


def verdict_samples(prefix: str, verdict) -> list[tuple]:
    return [(f"{prefix}_last_run_verdict", {"verdict": v}, 1.0 if verdict == v else 0.0,
             "The last run's verdict or outcome, one sample each, 1 for the one it had "
             "(usage: it could not begin; not_started: the server never became healthy "
             "or could not be trusted; not_warmed: start.sh --no-warmup; starting: start.sh "
             "launched a server, no warm-up yet; running: begun, not ended).") for v in VERDICTS]


def render(samples: list[tuple]) -> str:
    """Prometheus text format 0.0.4: each family's HELP and TYPE (gauge), then its samples."""
    lines, seen = [], set()
    for name, labels, value, help_text in samples:
        if name not in seen:
            seen.add(name)
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        inner = ",".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
        shown = repr(float(value)) if math.isfinite(value) else json_number(value)
        lines.append(f"{name}{{{inner}}} {shown}" if labels else f"{name} {shown}")
    return "\n".join(lines) + "\n"


def previous_samples(path: str) -> list[tuple]:
    """What the file holds now (name, labels, value, help), or [] when it holds nothing
    readable; only offload_ samples are kept."""
    try:
        with open_regular(path) as handle:
            data = handle.read(MAX_TEXTFILE_BYTES + 1)
    except OSError:
        return []
    if len(data) > MAX_TEXTFILE_BYTES:
        return []                         # not ours, or damaged: nothing is carried over
    text = data.decode("utf-8", "replace")
    helps = {}
    for line in text.split("\n"):
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[:2] == ["#", "HELP"]:
            helps[parts[2]] = parts[3]
    kept, seen = [], set()
    for name, labels, value in parse_prometheus(text).samples:
        key = (name, tuple(sorted(labels.items())))
        if name.startswith("offload_") and key not in seen:
            seen.add(key)
            kept.append((name, labels, value, clean_help(helps.get(name))))
    return kept


def escape(value: str) -> str:
    """A label value as the text format writes it: backslash, quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def clean_help(text: str | None) -> str:
    """A HELP text carried over: printable, no escapes, or a plain stand-in."""
    if not text or not all(" " <= ch <= "~" for ch in text) or "\\" in text:
        return "Kept from the previous file."
    return text


def merged(prefix: str, fresh: list[tuple], before: list[tuple]) -> list[tuple]:
    """This run's samples, other programs' samples as they were, and this program's last
    success time from before when this run did not pass. Pure."""
    success = f"{prefix}_last_success_timestamp_seconds"
    kept = [s for s in before if not s[0].startswith(prefix + "_")]
    if not any(s[0] == success for s in fresh):
        kept += [s for s in before if s[0] == success][:1]
    return sorted(kept + fresh, key=lambda s: s[0])     # a family's samples together


def publish(path: str, prefix: str, fresh: list[tuple]) -> str | None:
    """Write the textfile; None when written, else why not (one line). A file that cannot
    be rewritten is removed (unlinking needs no space): no older success stays standing."""
    return write_or_remove(path, render(merged(prefix, fresh, previous_samples(path))))


def write_or_remove(path: str, text: str) -> str | None:
    """The textfile written atomically; one that cannot be is removed (no older success
    stays standing). None when written, else why not."""
    why = write_atomically(path, text)
    if why is None:
        return None
    try:
        if regular(path):
            os.remove(path)
            return f"cannot write the textfile {path}: {why}; removed it (no older result stays)"
    except OSError as exc:
        return f"cannot write the textfile {path}: {why}; nor remove it ({exc.strerror or exc})"
    return f"cannot write the textfile {path}: {why}"


def carry(stage: str, path: str) -> str | None:
    """What a step published to its own file `stage` moved into `path` in one write (each
    program's families replacing that program's, its last success kept as publish keeps
    it): start.sh --supervise, the one writer of `path`. None when written."""
    fresh = previous_samples(stage)
    samples = previous_samples(path)
    for mode in sorted({name.split("_")[1] for name, *_ in fresh if name.count("_") > 1}):
        prefix = f"offload_{mode}"
        samples = merged(prefix, [s for s in fresh if s[0].startswith(prefix + "_")], samples)
    return write_or_remove(path, render(samples)) if fresh else None


def publish_outcome(path: str, mode: str, verdict: str, exit_code: int) -> str | None:
    """An ending no summary says (a usage error, a KILL, start.sh's own), or a begun state,
    published for program `mode` (offload_<mode>_*): success 0; None when written."""
    prefix = f"offload_{mode}"
    return publish(path, prefix, result_samples(
        prefix, {"verdict": verdict, "exit_code": exit_code}, time.time()))


def ended_since(path: str, prefix: str, since: float) -> bool:
    """The textfile holds an ending (not a run begun) published at or after `since`."""
    samples = {(name, tuple(labels.items())): value
               for name, labels, value, _ in previous_samples(path)}
    ended = samples.get((f"{prefix}_last_run_timestamp_seconds", ()))
    return ended is not None and ended >= since and not any(
        samples.get((f"{prefix}_last_run_verdict", (("verdict", v),))) == 1.0 for v in BEGUN)
