"""Prometheus text format 0.0.4, parsed exactly: every line that cannot be read is named."""

from __future__ import annotations

import re
from collections import namedtuple

from core.sanitize import clean_text


_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

_LABEL_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}

_VALUE = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)")

_TIMESTAMP = re.compile(r"-?[0-9]{1,19}")

_LINE_BREAKERS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x85\u2028\u2029\ufeff]")

# One /metrics body: the samples read ((name, labels, value)), every line that could not be
# read exactly ((line number, why, line)), and each metric's type from its # TYPE line.
Exposition = namedtuple("Exposition", "samples bad_lines declared")


def parse_prometheus(text: str) -> Exposition:
    """Prometheus text format 0.0.4, line by line (split on LF only, as the format says)."""
    samples, bad, declared = [], [], {}
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip(" \t")
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "TYPE":
                declared[parts[2]] = parts[3] if len(parts) > 3 else "untyped"
            continue
        try:
            if _LINE_BREAKERS.search(line):
                raise ValueError("a control character, BOM or line separator in the line")
            samples.append(_parse_sample(line))
        except (ValueError, IndexError) as exc:
            why = str(exc) if isinstance(exc, ValueError) and str(exc) else "not a sample line"
            bad.append((number, why, raw))
    return Exposition(samples, bad, declared)


def _parse_sample(line: str) -> tuple[str, dict, float]:
    match = _METRIC_NAME.match(line)
    if not match:
        raise ValueError("no metric name")
    name, pos, labels = match.group(), match.end(), {}
    after = line[pos:].lstrip(" \t")
    if after.startswith("{"):            # Prometheus allows blanks between name and labels
        labels, pos = _parse_labels(line, len(line) - len(after) + 1)
    if pos < len(line) and line[pos] not in " \t":
        raise ValueError("unexpected character after the name or labels")
    rest = line[pos:].split()
    if len(rest) not in (1, 2):          # value, then an optional timestamp
        raise ValueError("expected a value and at most an integer timestamp")
    if not _VALUE.fullmatch(rest[0]):
        raise ValueError(f"value {rest[0][:20]!r} is not a number")
    if len(rest) == 2 and not _TIMESTAMP.fullmatch(rest[1]):
        raise ValueError(f"timestamp {rest[1][:20]!r} is not an integer")
    return name, labels, float(rest[0])


def _parse_labels(line: str, pos: int) -> tuple[dict, int]:
    labels = {}
    while True:
        while line[pos] in " \t":
            pos += 1
        if line[pos] == "}":
            return labels, pos + 1
        match = _LABEL_NAME.match(line, pos)
        if not match:
            raise ValueError("bad label name")
        key, pos = match.group(), match.end()
        while line[pos] in " \t":
            pos += 1
        if line[pos] != "=" or line[pos + 1] != '"':
            raise ValueError("bad label")
        pos, chars = pos + 2, []
        while line[pos] != '"':
            if line[pos] == "\\":
                pos += 1
                chars.append(_LABEL_ESCAPES.get(line[pos], "\\" + line[pos]))
            else:
                chars.append(line[pos])
            pos += 1
        if key in labels:
            raise ValueError(f"label {key} twice")
        labels[key] = "".join(chars)
        pos += 1
        while line[pos] in " \t":
            pos += 1
        if line[pos] == ",":
            pos += 1
        elif line[pos] != "}":
            raise ValueError("bad label list")


def series_key(name: str, labels: dict) -> str:
    """name{k="v",...} with sorted labels; label values come from the server, so cleaned."""
    inner = ",".join(f'{k}="{clean_text(v, 200)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}" if labels else name


def series_name(key: str) -> str:
    """The metric name of a series key made by series_key."""
    return key.split("{")[0]
