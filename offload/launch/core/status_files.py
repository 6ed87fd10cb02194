"""Status files: a JSON document another process rewrites on a timer, read before the
warm-up's first wave and once fresh after the last (or fresh around each probe round); its
numeric deltas recorded.

Loaded only when --status-file is given.
"""

from __future__ import annotations

import math
import os
import time

from core.files import read_json_file
from core.sanitize import clean_text, json_number
from core.transport import MAX_JSON_DEPTH

TYPE_CHECKING = False                 # typing's, without importing typing (3 ms)
if TYPE_CHECKING:                     # names in annotations only: no import at run time
    from core.runframe import Run
    from core.vllm_client import Tally

STATUS_IDENTITY = ("pid", "session", "session_id", "boot_id", "started_at", "start_time")


def flatten_numbers(doc, prefix: str = "", depth: int = 0) -> dict[str, float]:
    """A status document's numeric fields as dotted keys (booleans are not numbers)."""
    found = {}
    if isinstance(doc, dict) and depth < MAX_JSON_DEPTH:
        for key, value in list(doc.items())[:1000]:
            found.update(flatten_numbers(value, f"{prefix}{clean_text(str(key), 64)}.",
                                         depth + 1))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool) and math.isfinite(doc):
        found[prefix[:-1]] = doc
    return found


def status_delta(before: dict | None, after: dict | None, why_missing: str | None = None) -> dict:
    """Numeric deltas of a status file; 'invalid' when its identity (pid, session) changed,
    'unverified' when it has no identity field to compare."""
    if before is None or after is None:
        return {"state": "incomplete", "why": why_missing or "no snapshot", "delta": None}
    changed = [f"{k} changed ({clean_text(str(before.get(k)), 40)} -> "
               f"{clean_text(str(after.get(k)), 40)})"
               for k in STATUS_IDENTITY if before.get(k) != after.get(k)]
    b, a = flatten_numbers(before), flatten_numbers(after)
    delta = {k: json_number(a[k] - b[k]) if k in a and k in b else None
             for k in sorted(set(a) | set(b)) if k.split(".")[0] not in STATUS_IDENTITY}
    if changed:
        return {"state": "invalid", "why": "; ".join(changed), "delta": delta}
    if not any(k in before for k in STATUS_IDENTITY):
        return {"state": "unverified", "delta": delta,
                "why": f"no identity field ({', '.join(STATUS_IDENTITY)}) to show both snapshots "
                       f"come from the same process"}
    return {"state": "valid", "why": None, "delta": delta}


def status_records(run: Run, paths: tuple, wait: tuple, status_before: dict,
                   tally: Tally) -> None:
    """Each status file read again once fresh (`wait`: its seconds and time field): its
    `status` record, and a warning unless valid."""
    for path in paths:
        before, why_before = status_before.get(path, (None, "not read"))
        after, why_after, fresh_by = wait_for_status(
            run, path, wait, missing_before=before is None
            and str(why_before).startswith("missing"))
        why = "; ".join([f"before: {why_before}"] * bool(why_before)
                        + [f"after: {why_after}"] * bool(why_after)) or None
        result = status_delta(before, after, why)
        run.write(dict({"record": "status", "run_id": run.settings.run_id, "path": path},
                       **result, fresh_by=fresh_by))
        if result["state"] != "valid":
            tally.warnings.append(f"status file {path}: {result['state']}: {result['why']}")


def round_status(run: Run, paths: tuple, wait: tuple, snapshots: dict) -> None:
    """Each status file once fresh (`wait`: its seconds and time field), appended to its
    list in `snapshots`: the probe reads it before each round and after the last."""
    for path in paths:
        doc, why, _ = wait_for_status(run, path, wait)
        snapshots.setdefault(path, []).append((doc, why))


def round_status_deltas(snapshots: dict) -> dict:
    """Per status file, its numeric deltas over each probe round and, for each field that
    moved, the first round against the median of the later ones (a worker's rounds,
    failures, watchdog counts: evidence, as the timings). Pure."""
    found = {}
    for path, taken in snapshots.items():
        rounds = [status_delta(a[0], b[0], a[1] or b[1]) for a, b in zip(taken, taken[1:])]
        moved = {}
        for key in sorted({k for r in rounds for k, v in (r["delta"] or {}).items() if v}):
            values = [(r["delta"] or {}).get(key) for r in rounds]
            later = sorted(v for v in values[1:] if v is not None)
            middle = len(later) // 2
            median = None if not later else later[middle] if len(later) % 2 else \
                (later[middle - 1] + later[middle]) / 2
            moved[key] = {"first": values[0] if values else None,
                          "later_median": None if median is None else json_number(median)}
        found[path] = {"states": [r["state"] for r in rounds], "moved": moved}
    return found


def wait_for_status(run: Run, path: str, wait: tuple, missing_before: bool = False
                    ) -> tuple[dict | None, str | None, str | None]:
    """The status file once fresh, within --status-wait-s and the deadline: (document,
    why not, what told it fresh). Fresh is a new value of its own timestamp field
    (--status-time-field), the writer's word; only a file without that field is told
    fresh by its modification time."""
    if missing_before and not os.path.exists(path):
        return None, "missing (and missing before the first wave: not waited for " \
            "again)", None
    wait_s, field = wait
    if os.path.exists(path) and not os.path.isfile(path):
        return None, "not a regular file (a FIFO or a device could block the read)", None
    run.say(f"waiting up to {wait_s:g} s for {path} to be rewritten")
    asked, stamp = time.time(), time_stamp(path, field)
    limit = time.monotonic() + min(wait_s, max(run.clock.remaining() - 1, 0))
    while True:
        try:
            moved = os.stat(path).st_mtime > asked
            doc = read_json_file(path)[0] if moved or stamp is not None else None
            if isinstance(doc, dict) and stamped(doc, field):
                if doc[field] != stamp and not later_than(stamp, doc[field]):
                    return doc, None, f"its {field} field"
            elif isinstance(doc, dict) and moved:
                return doc, None, f"modification time (no {field} field)"
        except FileNotFoundError:
            if time.monotonic() >= limit:
                return None, "missing", None
        except OSError:
            pass                                # being rewritten: read it again
        if time.monotonic() >= limit:
            return None, (f"stale: no fresh {field} (nor, without one, a rewrite) within "
                          f"{wait_s:g} s (or the time left to the deadline)"), None
        time.sleep(0.1)


def later_than(first, second) -> bool:
    """A timestamp that went backwards: `first` (numbers, or ISO strings of one shape)
    after `second`. A rewrite that turns time back is not fresh."""
    if isinstance(first, str) and isinstance(second, str) and len(first) == len(second):
        return first > second
    return isinstance(first, (int, float)) and isinstance(second, (int, float)) and \
        not isinstance(first, bool) and first > second


def stamped(doc: dict, field: str) -> bool:
    """The document carries its timestamp field (a number or a string)."""
    return isinstance(doc.get(field), (int, float, str)) and not isinstance(doc[field], bool)


def time_stamp(path: str, field: str):
    """A status file's timestamp field now (None: unreadable, or no such field)."""
    try:
        doc, _ = read_json_file(path)
    except OSError:
        return None
    return doc[field] if isinstance(doc, dict) and stamped(doc, field) else None
