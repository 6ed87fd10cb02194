"""Records of a probe and a gate in lines, for the terminal and the report.

Any value from a records file goes through records.show(): a file cannot put a control
character, a secret or a long value on an operator's terminal.
"""

from __future__ import annotations

from core.records import show


def known(value) -> str:
    """A value the run may not have learned: 'unknown' rather than '-' or 'None'."""
    return "unknown" if value is None else show(value)


def probe_line(entry) -> str:
    """One item (on one engine) in a line (a probe_item, typed); any value through show()."""
    def first_and_later(name: str, first, later, ratio) -> str:
        first, later = ("-" if v is None else f"{v * 1000:.0f} ms" for v in (first, later))
        return f"{name} first {first} vs later {later} (x{show(ratio)})"
    where = show(entry.item) + ("" if entry.engine is None else f" e{show(entry.engine)}")
    ttft = first_and_later("TTFT", entry.ttft_first_s, entry.ttft_later_median_s,
                           entry.ttft_ratio)
    total = first_and_later("total", entry.total_first_s, entry.total_later_median_s,
                            entry.total_ratio)
    line = f"  {where:<16} {ttft}; {total}"
    if entry.cached_rounds:
        line += (f"; round {', '.join(show(n) for n in entry.cached_rounds)} served from the "
                 f"prefix cache, left out")
    return line


def gate_line(record) -> str:
    """One probe and shape in a line (a gate record, typed), figures only; any value through
    show()."""
    where = f"{show(record.shape):<7} {show(record.probe):<13}"
    if record.engine is not None:
        where = f"e{show(record.engine)} " + where
    if record.kind == "identifier":
        figure = "exact" if record.exact is True else \
            f"MISS (distance {show(record.edit_distance)})"
    else:
        figure = f"{show(record.word_errors)} typos, CER {record.cer:.4f}" \
            if record.cer is not None else "CER -"
    tokens = f"{show(record.completion_tokens)} tokens"
    if record.reasoning_tokens is not None:
        tokens += f" ({show(record.reasoning_tokens)} reasoning)"
    removed = (record.removed or []) + ([f"a preamble of {show(record.preamble_chars)} "
                                         f"characters"] if record.preamble_chars else [])
    line = (f"  {where} {figure:<20} finish {show(record.finish_reason)}  {tokens}"
            f"{'  removed ' + ', '.join(show(r) for r in removed) if removed else ''}  "
            f"{'ok' if record.ok else 'FAILED'}")
    if not record.ok:
        line += "".join(f"\n      {show(p, 300)}" for p in record.problems or [])
    return line


def gate_summary_line(summary) -> str:
    """The gate's summary in lines (a gate_summary record, typed)."""
    exact, worst = summary.identifiers_exact, summary.worst_cer
    line = (f"gate: {show(summary.verdict)}; identifiers exact: alone "
            f"{show(exact.get('alone'))}, batched {show(exact.get('batched'))}; worst passage: "
            f"{show(summary.worst_typos)} typos (allowed {show(summary.max_typos)}), CER "
            f"{'-' if worst is None else f'{worst:.4f}'}")
    if summary.preambles:
        line += (f"\n  preamble before the answer in {len(summary.preambles)} probe(s) "
                 f"({', '.join(show(p) for p in summary.preambles[:4])}"
                 f"{', ...' if len(summary.preambles) > 4 else ''}): the copy alone was scored")
    return line
