"""qualify.py probe: did the warm-up work? Time to first token, first round against later.

Rounds of single, burst3 and burst4 (and long) streamed requests, each behind the guard;
every prompt is new (a nonce first), so a later round is never a prefix-cache hit.
probe_summary() (pure) gives per item and engine round 1 against the median of later
rounds: a ratio, never a verdict.
"""

from __future__ import annotations

import argparse
import os
import statistics
import textwrap

from core.values import Value
from core.contract import NOT_REPORTED
from core.records import SHAPED, shaped
from core.kinds import KINDS, PATH_NAMES, judge, kinds_of, parse_paths, request_id
from core.prompts import (MAX_LONG_PROMPT_TOKENS, MIN_LONG_PROMPT_TOKENS, make_short_prompt,
                          new_nonce)
from core.cli import (EXIT_USAGE, add_status_wait_options, argument_type, emit, given_value,
                      whole)
from core.runframe import Fatal, Run, RunSettings, add_run_options
from core.sanitize import clean_text, count_value, finite_number
from core.transport import UsageError
from core.vllm_client import (ENVIRONMENT_HELP, Connection, ServerProgram, Slot,
                              add_server_options, answer_record, connection_from, read_slot,
                              server_main, slot_timing, template_kwargs_type)
from tools.lines import probe_line

PROG = "qualify.py probe"

PROBE_ITEMS = (("single", 1), ("burst3", 3), ("burst4", 4))


class ProbeOptions(Value):
    rounds: int = 3
    long_tokens: int = 0              # 0: no long item
    tokens: int = 32
    priority: int = 20
    paths: tuple = ()                 # request kinds of --paths, each an item at depth 1
    template_kwargs: dict | None = None
    counted: tuple = ()               # --metrics-counter: (Target, name, unit), read each round
    status_files: tuple = ()          # --status-file: read fresh around each round
    status_wait: tuple = (15.0, "timestamp")    # its wait (seconds) and time field

    @property
    def items(self) -> list[tuple[str, int]]:
        return list(PROBE_ITEMS) + ([("long", 1)] if self.long_tokens else []) + \
            [(k.name, 1) for k in kinds_of(self.paths)]


class WarmthProbe(ServerProgram):
    """Rounds of single, burst3, burst4 (and long) streamed requests, each round behind the
    guard like a wave; every request judged complete or not, warmth measured, never judged."""

    mode = "probe"

    def __init__(self, connection: Connection, options: ProbeOptions, settings: RunSettings):
        super().__init__(connection)
        self.options = options
        self.settings = settings
        self.long_prompts: dict = {}          # engine -> (prompt, counted or None)
        self.items: list = []                 # probe_summary() of the records
        self.marks: list = []                 # the operator counters before each round
        self.snapshots: dict = {}             # path -> [(status document, why none)]

    def planned_per_engine(self) -> int:
        return self.options.rounds * sum(depth for _, depth in self.options.items)

    def plan_fields(self) -> dict:
        options = self.options
        counts = [c for _, c in self.long_prompts.values()]
        return {"items": [{"item": i, "depth": d} for i, d in options.items],
                "rounds": options.rounds,
                "long_tokens": options.long_tokens or None,
                "long_prompt_tokens_counted": None if not counts or None in counts
                else min(counts),
                "tokens": options.tokens, "priority": options.priority, "stream": True,
                "prompts": "new every request", "deadline_s": self.settings.deadline_s,
                "socket_cap_s": self.settings.socket_cap_s}

    def summary_fields(self, run: Run) -> dict:
        return dict(super().summary_fields(run), probe=self.items)

    def steps(self, run: Run) -> None:
        options = self.options
        self.learn_server(run)
        if options.long_tokens:
            self.refuse_a_long_item_past_the_context()
            self.long_prompts = self.size_long_prompts(run, options.long_tokens, options.tokens)
        run.write_run_record()
        run.say(f"probe {run.settings.run_id}: {self.connection.target.display} model "
                f"{clean_text(self.server.model or '', 80)}, {options.rounds} rounds, deadline "
                f"{run.settings.deadline_s:g} s")
        try:
            self.run_rounds(run)
        finally:
            self.items = probe_summary(self.tally.requests)
            counters, status = counters_over_rounds(self, run), status_over_rounds(self, run)
        run.write({"record": "probe_summary", "run_id": run.settings.run_id,
                   "items": self.items, **({"counters": counters} if counters else {}),
                   **({"status": status} if status else {}),
                   "meaning": "first round against the median of later rounds; a ratio, "
                              "not a verdict on the warm-up; rounds served from the prefix "
                              "cache are left out"})
        records = self.tally.requests
        if records and all(r["cached_tokens"] is None for r in records
                           if r["http_status"] == 200):
            self.tally.notes.append(NOT_REPORTED)
        for entry in self.items:
            if entry["cached_rounds"]:
                where = "" if entry["engine"] is None else f" on engine {entry['engine']}"
                rounds = ", ".join(map(str, entry["cached_rounds"]))
                self.tally.notes.append(
                    f"{entry['item']}{where}: round {rounds} served from the prefix cache "
                    f"(cached_tokens > 0): left out of the ratios")
        run.say("probe (first round against the median of later rounds):")
        for entry in self.items:
            run.say(probe_line(shaped(entry, SHAPED["probe_item"])))
        for where, seen in (counters or {}).items():
            run.say(f"counter {seen['counter']} at {where}: round 1 {seen['first']}, later "
                    f"rounds' median {seen['later_median']} (each round: "
                    f"{', '.join(map(str, seen['rounds']))})")
        for path, seen in (status or {}).items():
            moved = "; ".join(f"{clean_text(k, 60)} {v['first']} then {v['later_median']}"
                              for k, v in list(seen["moved"].items())[:10]) or "nothing moved"
            run.say(f"status {clean_text(path, 120)} ({', '.join(seen['states'])}): round 1 "
                    f"then the later rounds' median: {moved}")

    def refuse_a_long_item_past_the_context(self) -> None:
        """--long-tokens larger than the server's context is a usage error, said in one
        line before anything is sent (the long item would otherwise be sized down)."""
        context, tokens = self.server.max_model_len, self.options.tokens
        if context is not None and self.options.long_tokens + tokens > context:
            raise Fatal(f"--long-tokens {self.options.long_tokens} does not fit the server's "
                        f"context: max_model_len {context} leaves room for "
                        f"{max(context - tokens, 0)} prompt tokens beside {tokens} completion "
                        f"tokens; give --long-tokens {max(context - tokens, 0)} or less; "
                        f"nothing was sent", EXIT_USAGE)

    def run_rounds(self, run: Run) -> None:
        """Each round, each item, behind the guard; stops at a refusal or the deadline."""
        options, run_id = self.options, run.settings.run_id
        for round_no in range(1, options.rounds + 1):
            if options.counted:
                read_counted(self, run)
            if options.status_files:
                from core.status_files import round_status
                round_status(run, options.status_files, options.status_wait, self.snapshots)
            for item, depth in options.items:
                label = f"{item} round {round_no}"
                if run.clock.remaining() <= 0:
                    self.tally.problems.append(f"deadline passed before {label}")
                    return
                slots = []
                for engine in self.server.engines:
                    for index in range(depth):
                        rid = request_id("probe", run_id, engine, item, f"r{round_no}", index)
                        prompt = self.prompt_for(run_id, item, depth, round_no, index, engine)
                        slots.append(self.make_slot(item_kind(item), index, rid, engine, prompt,
                                                    options.tokens, options.priority,
                                                    options.template_kwargs))
                finished = self.guarded_batch(run, label, slots,
                                              first=not self.tally.requests)
                if finished is None:
                    return
                for slot in finished:
                    record = probe_record(run, self, item, round_no, slot)
                    run.write(record)
                    self.tally.requests.append(record)

    def prompt_for(self, run_id: str, item: str, depth: int, round_no: int, index: int,
                   engine: int | None) -> str:
        """A prompt no earlier request sent: a nonce (or a per-request tag) first."""
        if item == "long":
            return fresh_long_prompt(self.long_prompts[engine][0])
        seed = f"{run_id}-{engine}-{item}-r{round_no}-{os.urandom(4).hex()}"
        return make_short_prompt(seed, depth, index)


def read_counted(probe: "WarmthProbe", run: Run) -> None:
    """The operator counters now (before a round, or after the last): bounded reads."""
    from core.counted import counted_value
    from core.transport import Clock
    wait = max(min(run.clock.remaining(), 2.0), 0.1)
    probe.marks.append({target.display: counted_value(target, Clock.start(wait, wait), name)
                        for target, name, _ in probe.options.counted})


def status_over_rounds(probe: "WarmthProbe", run: Run) -> dict | None:
    """--status-file over each round (read fresh after the last round too)."""
    if not probe.options.status_files or not probe.snapshots:
        return None
    from core.status_files import round_status, round_status_deltas
    round_status(run, probe.options.status_files, probe.options.status_wait, probe.snapshots)
    return round_status_deltas(probe.snapshots)


def counters_over_rounds(probe: "WarmthProbe", run: Run) -> dict | None:
    """--metrics-counter over each round (a read after the last round too)."""
    if not probe.options.counted or not probe.marks:
        return None
    from core.counted import round_deltas
    read_counted(probe, run)
    return round_deltas(probe.options.counted, probe.marks)


def fresh_long_prompt(sized: str) -> str:
    """The sized long prompt under a new nonce: the same length, no cached prefix."""
    return new_nonce() + " " + sized.split(" ", 1)[-1]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _slowest(values: list) -> float | None:
    """A burst is as slow as its slowest request; a missing time makes the round unknown."""
    values = [finite_number(v) for v in values]
    return None if not values or None in values else max(values)


def probe_summary(records: list[dict]) -> list[dict]:
    """Per item and engine: round 1 against the median of later rounds (each round: its
    slowest request), for TTFT and total; a ratio, never a verdict. A round served from
    the prefix cache (cached_tokens > 0) would look like warmth: it is named and left out."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for r in records:
        key = (r.get("item"), r.get("engine"))
        groups.setdefault(key, {}).setdefault(r.get("round"), []).append(r)
    items = []
    for (item, engine), rounds in groups.items():
        cached = sorted(n for n, rs in rounds.items()       # cached_tokens > 0 reported
                        if any(count_value(r.get("cached_tokens")) for r in rs))
        per_round = {n: (_slowest([r.get("ttft_s") for r in rs]),
                         _slowest([r.get("total_s") for r in rs]))
                     for n, rs in rounds.items() if n not in cached}
        first = per_round.get(1, (None, None))
        later = [v for n, v in per_round.items() if isinstance(n, int) and n > 1]
        entry = {"item": item, "engine": engine, "rounds": len(rounds),
                 "cached_rounds": cached}
        for i, name in enumerate(("ttft", "total")):
            warm = _median([v[i] for v in later])
            entry[f"{name}_first_s"] = first[i]
            entry[f"{name}_later_median_s"] = warm
            entry[f"{name}_ratio"] = round(first[i] / warm, 2) if first[i] and warm else None
        items.append(entry)
    return items


def item_kind(item: str):
    """An item's request kind: a --paths kind by its name; single, bursts and long are
    streamed completions (the long item's first token is its prefill: its TTFT is the
    figure a long first use pays, so it is never sent as B1's unstreamed kind)."""
    kind_ = KINDS.get(item)
    return kind_ if kind_ is not None and kind_.path else KINDS["stream"]


def probe_record(run: Run, probe: WarmthProbe, item: str, round_no: int, slot: Slot) -> dict:
    """One request: when its first token (streamed) and its end came, counts only, no
    text; judged by kinds.judge() against its kind."""
    timing, answer, kind_ = slot_timing(slot), read_slot(slot), item_kind(item)
    problems = judge(answer, kind_, probe.options.tokens, diagnose=probe.diagnose)
    response = slot.exchange.response
    first, sent = (response.watched_at if response is not None else None,
                   slot.exchange.sent_at)
    return {
        "record": "probe", "run_id": run.settings.run_id, "item": item, "round": round_no,
        "index": slot.index, "engine": slot.engine, "request_id": slot.request_id,
        "request_kind": kind_.name,
        "ttft_s": round(first - sent, 4) if first is not None and sent is not None else None,
        "total_s": timing["latency_s"], **answer_record(answer),
        "ok": not problems, "problems": problems,
    }


PROBE_EPILOG = ENVIRONMENT_HELP + """\
  WARMUP_PATHS        default for --paths

exit status: warmup.py --help's table (CONTRACT.md section 9); 0 here says every streamed
request was answered completely (usage, [DONE], its tokens), in time, and nothing about
warmth: the ratios are measurements, not a verdict.
"""


def counter_type(text: str) -> tuple:
    """--metrics-counter's value (core.counted's grammar, loaded with the flag)."""
    from core.cli import plug_in
    try:
        return plug_in("core.counted").counted_type(text)
    except UsageError as exc:             # the folder lost it: argparse's usage error
        raise ValueError(str(exc)) from None


def build_probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=PROG, epilog=PROBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "Did the warm-up work? Measure time to first token and total time with "
                    "streamed completions: a single request, a burst of 3 and a burst of 4 "
                    "(and a long prompt), repeated --rounds times, on every engine; report the "
                    "first round against the median of the later ones, per engine. Every "
                    "prompt is new (a nonce first), so a later round is not a prefix-cache "
                    "hit; cached tokens are recorded and a round served from the cache is "
                    "named and left out. A ratio, never a verdict.", 79))
    add_server_options(parser)
    add_run_options(parser)
    parser.add_argument("--tokens", metavar="N", type=whole(2, 4096), default=32,
                        help="completion tokens per request (default: %(default)s)")
    parser.add_argument("--priority", metavar="N", type=whole(-(1 << 31), (1 << 31) - 1),
                        default=20, help="request priority (default: %(default)s)")
    parser.add_argument("--rounds", metavar="N", type=whole(2, 100), default=3,
                        help="rounds of single, burst3, burst4 (default: %(default)s)")
    parser.add_argument("--long-tokens", type=whole(0, MAX_LONG_PROMPT_TOKENS), default=0,
                        metavar="N",
                        help="also a long request of N prompt tokens (more than 4096; "
                             "32768 for a 32K first use), streamed (its TTFT is the prefill), "
                             "sized once with /tokenize, a new nonce every round; refused when "
                             "the server's context cannot hold it (default: none)")
    parser.add_argument("--paths", metavar="LIST", type=argument_type(parse_paths),
                        default=None,
                        help="also measure other request kinds, each an item at depth 1 "
                             f"({', '.join(PATH_NAMES)}, all or none), to see which a warm-up "
                             "left cold; chat's TTFT is its first visible answer token, after "
                             "any reasoning (default: $WARMUP_PATHS, else none)")
    parser.add_argument("--metrics-counter", metavar="URL=NAME", action="append", default=[],
                        type=argument_type(counter_type),
                        help="a worker's or proxy's Prometheus counter (worker rounds, "
                             "failures, a watchdog's), read before each round and after the "
                             "last: its delta per round, the first against the later ones "
                             "(evidence, as the timings; repeat for several)")
    parser.add_argument("--status-file", metavar="PATH", action="append", default=[],
                        help="a JSON status file a worker rewrites on a timer, read fresh "
                             "before each round and after the last: each numeric field's "
                             "delta per round, the first against the later ones (repeat for "
                             "several; each read waits for a rewrite, within the deadline)")
    add_status_wait_options(parser, "before each round and after the last")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=template_kwargs_type,
                        help="a JSON object passed to the chat template by the chat kinds")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


def probe_main(argv: list[str]) -> int:
    """qualify.py probe: the same connection options, guards, bounds and records as the
    warm-up."""
    return server_main(build_probe_parser(), argv, PROG, "probe", build_probe)


def build_probe(args: argparse.Namespace, settings: RunSettings):
    """The parsed options -> (the WarmthProbe, its dry run); UsageError naming a bad value."""
    if args.long_tokens and args.long_tokens < MIN_LONG_PROMPT_TOKENS:
        raise UsageError(f"--long-tokens must be more than {MIN_LONG_PROMPT_TOKENS - 1}")
    paths, _ = given_value(args.paths, "--paths", "WARMUP_PATHS", parse_paths, ())
    options = ProbeOptions(rounds=args.rounds, long_tokens=args.long_tokens,
                           tokens=args.tokens, priority=args.priority, paths=paths,
                           template_kwargs=args.chat_template_kwargs,
                           counted=tuple(args.metrics_counter),
                           status_files=tuple(args.status_file),
                           status_wait=(args.status_wait_s, args.status_time_field))
    connection = connection_from(args)

    def print_plan():
        long = f", long ({args.long_tokens} tokens)" if args.long_tokens else ""
        kinds = "".join(f", {k.name}" for k in kinds_of(options.paths))
        emit(f"probe plan for {connection.target.display}: {args.rounds} rounds of single, "
             f"burst3, burst4{long} (streamed){kinds}; {args.tokens} tokens each, every "
             f"prompt new; deadline {settings.deadline_s:g} s")
    return WarmthProbe(connection, options, settings), print_plan
