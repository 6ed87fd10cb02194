"""qualify.py compat: does a running vLLM still answer as this helper relies on?

Before a fleet runs a new vLLM: each route, metric, label and request field the warm-up,
start.sh and the readiness checks read, checked once against a running server (one
4-token completion, idle time of a staging server), each said held or missing; with
--log, the server log lines start.sh reads. Exit 0 only when every one holds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from core.cli import EXIT_FAIL, EXIT_PASS, emit, seconds
from core.files import open_regular
from core.kinds import KINDS, completion_body, judge
from core.prometheus import parse_prometheus
from core.records import parse_fields, record_class
from core.sanitize import REDACTIONS, clean_text, count_value
from core.transport import (Clock, TransportError, UsageError, base_url_from, decode_json,
                            fetch, is_header_value)
from core.vllm_client import extract_fields
from core.vllm_metrics import (GAUGES, SLEEP_GAUGE, engine_index, process_start,
                               served_by_engine)
from tools.vllm_log import logged_chunk

PROG = "qualify.py compat"
COUNTERS = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total",
            "vllm:request_success_total")
TOKENS = 4                             # the completion's min_tokens = max_tokens
Check = record_class("check", parse_fields("check:str held:bool? said:str"))


def check(name: str, held: bool | None, said: str = ""):
    """One thing the helper relies on: held, missing (False), or not enabled (None)."""
    return Check(check=name, held=held, said=said)


def route_checks(target, clock: Clock, key: str | None) -> tuple[list, str | None]:
    """/health, /v1/models (the model it names), /tokenize: (checks, the model)."""
    found, model = [], None
    for path in ("/health", "/v1/models"):
        try:                              # only /v1 takes the key, as the warm-up sends it
            response = fetch(target, clock, "GET", path,
                             bearer=key if path.startswith("/v1/") else None)
        except TransportError as exc:
            found.append(check(f"GET {path}", False, f"no answer ({exc.problem})"))
            continue
        doc = decode_json(response.body)[0] if response.status == 200 else None
        data = doc.get("data") if isinstance(doc, dict) else None
        ids = [d.get("id") for d in data if isinstance(d, dict)] if isinstance(data, list) else []
        if path == "/v1/models" and ids and isinstance(ids[0], str):
            model = ids[0]
        held = response.status == 200 and (path == "/health" or model is not None)
        found.append(check(f"GET {path}", held, f"HTTP {response.status}" + (
            "" if held or path == "/health" else ", no model id in data[]")))
    if model is None:
        return found + [check("POST /tokenize", False, "no model to count for")], None
    try:
        response = fetch(target, clock, "POST", "/tokenize", {"model": model, "prompt": "x y"})
        doc = decode_json(response.body)[0] if response.status == 200 else None
        counted = count_value(doc.get("count")) if isinstance(doc, dict) else None
        found.append(check("POST /tokenize (B1 sized exactly)", counted is not None,
                           f"HTTP {response.status}" + ("" if counted is not None else
                                                         ", no integer count: B1 estimated")))
    except TransportError as exc:
        found.append(check("POST /tokenize (B1 sized exactly)", False,
                           f"no answer ({exc.problem})"))
    return found, model


def metrics_checks(text: str) -> list:
    """/metrics: the request gauges and counters with their engine label, the process
    start, the sleep gauge (pure)."""
    exposition = parse_prometheus(text)
    samples = exposition.samples
    found = [check("GET /metrics in Prometheus text", not exposition.bad_lines,
                   f"{len(exposition.bad_lines)} line(s) cannot be read"
                   if exposition.bad_lines else f"{len(samples)} samples")]
    for name in GAUGES + COUNTERS:
        mine = [labels for series, labels, _ in samples if series == name]
        declared = name in exposition.declared or name.removesuffix("_total") in \
            exposition.declared
        unlabelled = [labels for labels in mine if engine_index(labels.get("engine")) is None]
        reason = name == "vllm:request_success_total" and mine and \
            not all("finished_reason" in labels for labels in mine)
        held = bool(mine) and not unlabelled and not reason or not mine and declared and \
            name in GAUGES
        said = "not published" if not mine and not declared else \
            "declared, no samples yet (a fresh engine)" if not mine else \
            f"a sample without an engine index label (labels: " \
            f"{', '.join(sorted(unlabelled[0])) or 'none'})" if unlabelled else \
            "no finished_reason label" if reason else f"{len(mine)} series, engine labelled"
        found.append(check(name, held, said))
    start, served = process_start(samples), served_by_engine(samples)
    found.append(check("the server's identity (process_start_time_seconds, else requests "
                       "served per engine)", start is not None or bool(served),
                       "process_start_time_seconds" if start is not None else
                       f"requests served on {len(served)} engine(s) (no process start: a "
                       f"data-parallel server's)" if served else "neither"))
    sleep = [labels for series, labels, _ in samples if series == SLEEP_GAUGE]
    labelled = all(engine_index(labels.get("engine")) is not None for labels in sleep)
    found.append(check(f"{SLEEP_GAUGE} (sleep and wake)", labelled if sleep else None,
                       "not published: sleep mode not watched" if not sleep else
                       f"{len(sleep)} series, engine labelled" if labelled else
                       "a sample without an engine index label"))
    return found


def request_check(target, clock: Clock, key: str | None, model: str):
    """One raw completion as the warm-up sends it (min_tokens = max_tokens, ignore_eos,
    greedy, priority), held to the warm-up's own rules."""
    name = "POST /v1/completions: min_tokens, ignore_eos, priority"
    rid = f"compat-{int(time.time())}"
    body = completion_body(model, "compat check of the warm-up's request", rid, TOKENS, 20)
    try:
        response = fetch(target, clock, "POST", "/v1/completions", body, bearer=key)
    except TransportError as exc:
        return check(name, False, f"no answer ({exc.problem})")
    problems = judge(extract_fields(response.status, response.body), KINDS["greedy"], TOKENS)
    return check(name, not problems, "; ".join(problems[:2]) or
                 f"{TOKENS} tokens, finish length")


def log_checks(path: str) -> list:
    """The server log lines start.sh reads: the prefill chunk."""
    try:                                  # a regular file only: a FIFO would never end
        with open_regular(path) as handle:
            text = handle.read(16 << 20).decode("utf-8", "replace")
    except OSError as exc:
        return [check(f"log {clean_text(path, 200)}", False,
                      f"cannot be read ({exc.strerror or 'not a regular file'})")]
    chunk = logged_chunk(text)
    return [check("log: the prefill chunk line", bool(chunk), f"max_num_batched_tokens "
                  f"{chunk}" if chunk else "not found: start.sh assumes 4096 unless the "
                  "command pins --max-num-batched-tokens")]


def compat(target, key: str | None, timeout_s: float, log: str | None) -> list:
    """Every check, in order, against one server."""
    clock = Clock.start(timeout_s, min(timeout_s, 30.0))
    found, model = route_checks(target, clock, key)
    try:
        response = fetch(target, clock, "GET", "/metrics")
        found += metrics_checks(response.body.decode("utf-8", "replace")) \
            if response.status == 200 else [check("GET /metrics", False,
                                                  f"HTTP {response.status}")]
    except TransportError as exc:
        found.append(check("GET /metrics", False, f"no answer ({exc.problem})"))
    found.append(request_check(target, clock, key, model) if model else
                 check("POST /v1/completions", False, "no model to send it to"))
    return found + (log_checks(log) if log else [])


def compat_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog=PROG, allow_abbrev=False, description=" ".join(
        __doc__.split("\n\n")[1].split()))
    parser.add_argument("--base-url", metavar="URL", default=None,
                        help="the server (default: $WARMUP_BASE_URL, else "
                             "http://127.0.0.1:8000)")
    parser.add_argument("--api-key-env", metavar="NAME", default="VLLM_API_KEY",
                        help="the variable holding the server's API key, sent as the "
                             "warm-up sends it (default: %(default)s)")
    parser.add_argument("--log", metavar="FILE",
                        help="the server's log (start.sh's LOG_DIR/server.log): check the "
                             "lines start.sh reads in it too")
    parser.add_argument("--timeout-s", metavar="S", type=seconds(600.0), default=60.0,
                        help="the whole check's bound (default: %(default)g)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    try:
        target = base_url_from(args.base_url)
    except UsageError as exc:
        parser.error(str(exc))
    key = os.environ.get(args.api_key_env) or None
    if key is not None and not is_header_value(key):
        parser.error(f"{args.api_key_env} is not printable ASCII")
    REDACTIONS.secret(key)
    found = compat(target, key, args.timeout_s, args.log)
    missing = [c for c in found if c.held is False]
    code = EXIT_FAIL if missing else EXIT_PASS
    if args.json:
        emit(json.dumps({"checks": found, "missing": len(missing), "exit_code": code}))
    else:
        emit("\n".join(f"{'held   ' if c.held else 'MISSING' if c.held is False else 'n/a    '}"
                       f" {c.check}: {clean_text(c.said, 200)}" for c in found)
             + f"\ncompat {target.display}: {sum(1 for c in found if c.held)} held, "
               f"{len(missing)} missing (exit {code})", sys.stdout)
    return code
