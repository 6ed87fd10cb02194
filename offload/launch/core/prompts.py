"""Synthetic prompts: distinct per request, never recorded; a long one sized to a budget.

Plain functions of data, no I/O. The long prompt starts with a nonce so no cached prefix
can match it; size_long_prompt() sizes it with a counting function (the server's
/tokenize, given by vllm_client), and the budget leaves room for the completion.
"""

from __future__ import annotations

import os
import random

from core.runframe import Fatal
from core.sanitize import clean_text

MIN_LONG_PROMPT_TOKENS = 4097        # a long prompt prefills more than 4096 tokens
MAX_LONG_PROMPT_TOKENS = 1 << 20     # the largest asked for; the context caps it further
ONE_STEP_FLOOR = 1024                # the fewest prompt tokens a context must hold for B1
ONE_STEP_MARGIN = 16                 # fewer tokens past the chunk cannot be sized: one step

FILLER_WORDS = (
    "the of and to in is was for on are with as by at from or an be this which have "
    "time year people way day man thing woman life child world school state family "
    "group country problem hand part place case week company system program question "
    "work government number night point home water room mother area money story fact "
    "month lot right study book eye job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level "
    "office door health person art war history party result change morning reason "
    "research girl guy moment air teacher force education river market signal garden "
    "engine table window paper stone music north south summer winter yellow orange "
    "simple quiet rapid gentle mountain station letter silver forest island bridge"
).split()

SHORT_PROMPT_WORDS = 24

def new_nonce() -> str:
    """A long prompt's first word, new for each prompt: no cached prefix can match it."""
    return "warmup-" + os.urandom(12).hex()


def make_long_prompt(nonce: str, n_words: int) -> str:
    """B1's prompt: the nonce first (so no cached prefix matches), then filler words."""
    rng = random.Random(nonce)
    return nonce + " " + " ".join(rng.choices(FILLER_WORDS, k=n_words))


def make_short_prompt(seed: str, depth: int, index: int) -> str:
    """A distinct prompt of a few tens of tokens; its first word differs per request."""
    rng = random.Random(f"{seed}/{depth}/{index}")
    tag = f"{rng.getrandbits(48):012x}"
    return tag + " " + " ".join(rng.choices(FILLER_WORDS, k=SHORT_PROMPT_WORDS))


def b1_bounds(target: int, tokens: int, chunk: int, context: int | None
              ) -> tuple[int, int, bool]:
    """B1's (budget, fewest tokens, in one prefill step): at most `target` and the context
    less `tokens`, longer than the chunk and 7/8 of the budget (or 4096); a context with
    no room ONE_STEP_MARGIN past the chunk: at least 7/8 of one step."""
    room = target if context is None else context - tokens
    if room >= chunk + ONE_STEP_MARGIN:
        budget = min(target, room)
        return budget, max(chunk + 1, min(budget - budget // 8, MIN_LONG_PROMPT_TOKENS)), False
    budget = min(room, chunk)
    return budget, max(budget - budget // 8, 1), True


def long_prompt_budget(target: int, tokens: int, chunk: int, context: int | None
                       ) -> tuple[int, int]:
    """B1's budget and fewest tokens (b1_bounds); Fatal when the context cannot hold
    ONE_STEP_FLOOR prompt tokens beside the completion: no B1 worth the name fits."""
    if context is not None and context - tokens < ONE_STEP_FLOOR:
        raise Fatal(f"context too small: max_model_len {context} leaves room for "
                    f"{max(context - tokens, 0)} prompt tokens beside {tokens} completion "
                    f"tokens, fewer than the {ONE_STEP_FLOOR} a B1 prompt needs; no "
                    f"completion was sent")
    return b1_bounds(target, tokens, chunk, context)[:2]


SIZING_ROUNDS = 6

def size_long_prompt(count, nonce: str, budget: int, minimum: int = MIN_LONG_PROMPT_TOKENS
                     ) -> tuple[str, int | None]:
    """B1 sized to `budget` tokens by `count` (the server's /tokenize): (prompt, its count),
    or (an estimate, None) when it cannot count; never over the budget, its words within
    [budget / 8, 2 * budget] whatever the server answers."""
    low_words, high_words = max(1, budget // 8), 2 * budget
    n_words = max(1, budget)      # one word per token: sizing without /tokenize, never fewer
    low = max(minimum, int(budget * 0.97))
    best = None
    for _ in range(SIZING_ROUNDS):
        prompt = make_long_prompt(nonce, n_words)
        counted = count(prompt)
        if counted is None:
            return prompt, None
        if not isinstance(counted, int) or counted < 1:
            raise Fatal(f"could not size the B1 prompt: /tokenize answered count "
                        f"{clean_text(repr(counted), 40)}; no completion was sent")
        if counted <= budget:
            best = (prompt, counted)
            if counted >= low:
                return best
        # Tokens grow about linearly in words: aim just under the budget (mid-window when
        # the floor leaves less than 8 tokens below it).
        aim = max(budget - 8, (low + budget) // 2)
        n_words = min(high_words, max(low_words, int(n_words * aim / counted)))
    if best is not None and best[1] >= minimum:
        return best
    raise Fatal(f"could not size the B1 prompt between {minimum} and {budget} "
                f"tokens with the server's /tokenize; no completion was sent")

