"""Operator counters (--metrics-counter): what a proxy or a worker counted at each wave's
release and after the last, against what the warm-up sent (more is foreign work), and
over each round of `qualify.py probe`.

Loaded only when --metrics-counter is given.
"""

from __future__ import annotations

import math
import re

from core.prometheus import series_name
from core.sanitize import json_number
from core.transport import Target, parse_url
from core.vllm_metrics import read_counters


def counted_type(text: str) -> tuple:
    """--metrics-counter URL=NAME[:tokens] -> (Target, NAME, 'requests' or 'tokens')."""
    url, _, name = text.rpartition("=")
    name, _, unit = name.rpartition(":") if name.endswith((":tokens", ":requests")) \
        else (name, "", "")
    if not url or not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
        raise ValueError(f"wants URL=NAME or URL=NAME:tokens (a Prometheus metric name); "
                         f"got {text!r}")
    return parse_url(url, "--metrics-counter"), name, unit or "requests"


def round_deltas(counted: tuple, marks: list) -> dict:
    """Per operator counter (a worker's rounds, failures, a watchdog's), what it counted
    over each probe round (`marks`: its reads before each round and after the last), the
    first against the median of the later ones: evidence, like the timings. Pure."""
    found = {}
    for target, name, _ in counted:
        values = [seen.get(target.display) for seen in marks]
        rounds = [maybe_number(series_delta(a, b)[0]) for a, b in zip(values, values[1:])]
        later = sorted(r for r in rounds[1:] if r is not None)
        median = later[len(later) // 2] if len(later) % 2 else \
            (later[len(later) // 2 - 1] + later[len(later) // 2]) / 2 if later else None
        found[target.display] = {"counter": name, "rounds": rounds,
                                 "first": rounds[0] if rounds else None,
                                 "later_median": maybe_number(median)}
    return found


def counted_records(counted: tuple, marks: list, requests: list[dict]) -> dict:
    """Per operator counter: what it counted over the run and over each wave, against
    what the warm-up sent (its requests, or their prompt and completion tokens); more is
    foreign work, named with the waves it overlaps. Pure over the marks."""
    found = {}
    for target, name, unit in counted:
        values = [(wave, seen.get(target.display)) for wave, seen in marks]
        waves, foreign_in, whys = {}, [], set()
        for (wave, before), (_, after) in zip(values, values[1:]):
            sent = sent_by(unit, [r for r in requests if r.get("wave") == wave])
            delta, why = series_delta(before, after)
            whys.add(why)
            waves[wave] = {"delta": maybe_number(delta), "sent": sent}
            if delta is not None and delta > sent:
                foreign_in.append(wave)
        delta, why = series_delta(values[0][1], values[-1][1]) if values else (None, None)
        why = next((w for w in (WENT_DOWN, NOT_FINITE) if w in whys | {why}), why)
        sent = sent_by(unit, requests)
        found[target.display] = {
            "counter": name, "unit": unit, "delta": maybe_number(delta), "sent": sent,
            "foreign": None if delta is None or why else json_number(max(delta - sent, 0)),
            "went_down": why == WENT_DOWN, "why": why, "waves": waves,
            "overlaps": foreign_in}
    return found


def maybe_number(value: float | None):
    """A count as a record keeps it; None stays None (not read)."""
    return None if value is None else json_number(value)


WENT_DOWN = "went down during the warm-up (a restart or a reset)"
NOT_FINITE = "read NaN or an infinity"
UNREAD = "could not be read at every wave"


def counted_value(target: Target, clock, name: str) -> dict | None:
    """An operator counter's series now, by their labels (None: unreadable, absent)."""
    found, _ = read_counters(target, clock, "")
    values = {k: v for k, v in (found or {}).items() if series_name(k) == name}
    return values if values and all(v is not None for v in values.values()) else None


def series_delta(before: dict | None, after: dict | None) -> tuple[float | None, str | None]:
    """What a counter counted between two reads, series by series (a series new since the
    first read counts from 0): (delta, None), or (None, why it cannot be compared: a
    series went down or vanished, a value is not finite, a read failed). Pure."""
    if before is None or after is None:
        return None, UNREAD
    if not all(math.isfinite(v) for v in [*before.values(), *after.values()]):
        return None, NOT_FINITE
    if any(after.get(key, -math.inf) < value for key, value in before.items()):
        return None, WENT_DOWN
    return sum(value - before.get(key, 0.0) for key, value in after.items()), None


def sent_by(unit: str, requests: list[dict]) -> int:
    """What the warm-up sent, as an operator counter counts it: requests, or the prompt
    and completion tokens the server reported for them."""
    if unit == "requests":
        return len(requests)
    return sum((r.get("prompt_tokens") or 0) + (r.get("completion_tokens") or 0)
               for r in requests if isinstance(r.get("prompt_tokens"), int))


def foreign_said(source: str, counted: dict) -> list[str]:
    """The warning a counter that counted more than the warm-up sent gives (or why it
    could not be compared)."""
    if counted["delta"] is None or counted.get("why"):
        return [f"{source}: {counted['counter']} {counted.get('why') or UNREAD}: not "
                f"compared, foreign work there not checked"]
    if counted["delta"] < counted["sent"]:
        return [f"{source}: {counted['counter']} counted {counted['delta']:g} "
                f"{counted['unit']}, fewer than the {counted['sent']} the warm-up sent: "
                f"does it count this traffic?"]
    if not counted["foreign"]:
        return []
    during = f" (during {', '.join(map(str, counted['overlaps']))})" if counted["overlaps"] \
        else ""
    return [f"foreign work on {source}: {counted['counter']} counted {counted['delta']:g} "
            f"{counted['unit']}, the warm-up sent {counted['sent']}: {counted['foreign']:g} "
            f"more{during}"]
