"""Records of a probe and a gate in lines, for the terminal and the report.

Any value from a records file goes through records.show(): a file cannot put a control
character, a secret or a long value on an operator's terminal.
"""

from __future__ import annotations

from core.records import show
from core.sanitize import finite_number


def known(value) -> str:
    """A value the run may not have learned: 'unknown' rather than '-' or 'None'."""
    return "unknown" if value is None else show(value)


def probe_line(entry: dict) -> str:
    """One item (on one engine) in a line; any value from a file goes through show()."""
    def first_and_later(name: str, key: str) -> str:
        figures = [finite_number(entry.get(f"{key}_{when}")) for when in ("first_s",
                                                                         "later_median_s")]
        first, later = ("-" if v is None else f"{v * 1000:.0f} ms" for v in figures)
        return f"{name} first {first} vs later {later} (x{show(entry.get(f'{key}_ratio'))})"
    where = show(entry.get("item")) + ("" if entry.get("engine") is None
                                       else f" e{show(entry.get('engine'))}")
    line = (f"  {where:<16} {first_and_later('TTFT', 'ttft')}; "
            f"{first_and_later('total', 'total')}")
    cached = entry.get("cached_rounds") or []
    if cached:
        line += (f"; round {', '.join(show(n) for n in cached)} served from the prefix cache, "
                 f"left out")
    return line


def gate_line(record: dict) -> str:
    """One probe and shape in a line, figures only; any value from a file through show()."""
    where = f"{show(record.get('shape')):<7} {show(record.get('probe')):<13}"
    if record.get("engine") is not None:
        where = f"e{show(record.get('engine'))} " + where
    if record.get("kind") == "identifier":
        figure = "exact" if record.get("exact") is True else (
            f"MISS (distance {show(record.get('edit_distance'))})")
    else:
        cer = finite_number(record.get("cer"))
        figure = (f"{show(record.get('word_errors'))} typos, CER {cer:.4f}"
                  if cer is not None else "CER -")
    tokens = f"{show(record.get('completion_tokens'))} tokens"
    if record.get("reasoning_tokens") is not None:
        tokens += f" ({show(record.get('reasoning_tokens'))} reasoning)"
    removed = record.get("removed") or []
    if record.get("preamble_chars"):
        removed = removed + [f"a preamble of {show(record.get('preamble_chars'))} characters"]
    line = (f"  {where} {figure:<20} finish {show(record.get('finish_reason'))}  {tokens}"
            f"{'  removed ' + ', '.join(show(r) for r in removed) if removed else ''}  "
            f"{'ok' if record.get('ok') else 'FAILED'}")
    if not record.get("ok"):
        line += "".join(f"\n      {show(p, 300)}" for p in record.get("problems") or [])
    return line


def gate_summary_line(summary: dict) -> str:
    exact = summary["identifiers_exact"]
    worst = finite_number(summary.get("worst_cer"))
    line = (f"gate: {show(summary.get('verdict'))}; identifiers exact: alone "
            f"{show(exact.get('alone'))}, batched {show(exact.get('batched'))}; worst passage: "
            f"{show(summary.get('worst_typos'))} typos (allowed "
            f"{show(summary.get('max_typos'))}), CER {'-' if worst is None else f'{worst:.4f}'}")
    preambles = summary["preambles"]
    if preambles:
        line += (f"\n  preamble before the answer in {len(preambles)} probe(s) "
                 f"({', '.join(show(p) for p in preambles[:4])}"
                 f"{', ...' if len(preambles) > 4 else ''}): the copy alone was scored")
    return line
