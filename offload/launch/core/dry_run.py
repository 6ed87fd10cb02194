"""warmup.py --dry-run: the plan a run would send, printed, nothing sent (loaded with
the flag)."""

from __future__ import annotations

import json

from core.cli import emit
from core.contract import Plan, chunk_said, differences, plan_label, plan_record, wave_name
from core.kinds import kinds_of
from core.prompts import SHORT_PROMPT_WORDS
from core.runframe import RunSettings
from core.transport import MAX_BODY_BYTES
from core.vllm_client import Connection, format_engines


def print_plan(plan: Plan, settings: RunSettings, connection: Connection,
               as_json: bool, hard: float) -> None:
    """Print the plan, sending nothing (`hard`: the wrapper's bound, seconds)."""
    target, engines = connection.target, format_engines(connection.engines)
    description = dict(plan_record(plan), base_url=target.display, engines=engines,
                       deadline_s=settings.deadline_s, socket_cap_s=settings.socket_cap_s,
                       max_body_bytes=MAX_BODY_BYTES, hard_bound_s=hard,
                       differences=differences(plan))
    if as_json:
        emit(json.dumps(description, indent=2))
        return
    lines = [f"{plan_label(plan) if plan.file else 'plan'} for {target.display} (dry run: "
             f"nothing sent)"]
    if plan.file:                 # whole, as START_PLAN_SHA256 and --plan-sha256 take it
        lines.append(f"  sha256 {plan.file.sha256}")
    if plan.given:
        lines.append(f"  given: {', '.join(source for _, source in plan.given)}")
    for i, depth in enumerate(plan.waves):
        prompt = (f"1 long prompt of ~{plan.b1_target} tokens (more than the prefill "
                  f"{chunk_said(plan)}; capped by the server's context), run-unique nonce "
                  f"first") \
            if i == 0 else \
            f"{depth} distinct short prompts of ~{SHORT_PROMPT_WORDS + 1} words"
        lines.append(f"  {wave_name(depth):<4} {depth} concurrent: {prompt}")
    for kind_ in kinds_of(plan.paths):
        held = (f"1 to {plan.tokens} tokens (its grammar may end it)"
                if kind_.holds.tokens == "upto" else f"{plan.tokens} tokens")
        lines.append(f"  {kind_.name:<13} depths {','.join(map(str, plan.path_depths))}: "
                     f"{'streamed ' if kind_.stream else ''}{kind_.endpoint}, held to {held}")
    custom = differences(plan)
    if custom:
        lines.append(f"  custom plan, not the contract's: {'; '.join(custom)}")
    lines.append(f"  budget: {plan.requests_per_engine} requests, at most "
                 f"{plan.requests_per_engine * plan.tokens} completion tokens ({plan.tokens} "
                 f"each, min = max, ignore_eos, priority {plan.priority}; the waves greedy), "
                 f"per engine (engines: {engines})")
    lines.append(f"  bounds: deadline {settings.deadline_s:g} s, socket cap "
                 f"{settings.socket_cap_s:g} s, body cap {MAX_BODY_BYTES} bytes, hard bound "
                 f"{hard:g} s (warmup_serve.sh)")
    emit("\n".join(lines))
