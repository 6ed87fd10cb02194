#!/usr/bin/env python3
"""Which request variants a warm-up left cold: each one's first request against its later
ones, in total time, measured in one run against a server you name.

    python3 bench/variants.py --base-url http://127.0.0.1:8011 [--model NAME] [--later 3]

Run it right after a warm-up (`warmup_serve.sh --paths all`): a variant whose first
request takes far longer than its later ones pays a one-time cost the warm-up did not.
Each variant sends one request, then --later more, one at a time, every prompt new (a
nonce first, so no prefix-cache hit); the ratio is the first's total time over the median
of the later ones. The variants: plain temperature, unseeded top-p/top-k, seeded
top-p/top-k, prompt_logprobs, logprobs, n=2, repetition/frequency/presence penalties, a
JSON schema, and the contract's greedy request. Talks to the given address only; no text
is printed or kept. Not a test: CI does not run it (it needs a real server).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "offload", "launch"))

import core.kinds as kinds  # noqa: E402
import core.transport as transport  # noqa: E402

TOKENS = 32
VARIANTS = {                           # name -> what it adds to the greedy request
    "greedy (the contract's)": {},
    "plain temperature": {"temperature": 0.8},
    "top-p/top-k, unseeded": {"temperature": 0.8, "top_p": 0.95, "top_k": 40},
    "top-p/top-k, seeded": {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 11},
    "prompt_logprobs": {"prompt_logprobs": 5},
    "logprobs": {"logprobs": 5},
    "n=2": {"n": 2, "temperature": 0.8},
    "penalties": {"repetition_penalty": 1.1, "frequency_penalty": 0.5,
                  "presence_penalty": 0.5},
    "JSON schema": {"structured_outputs": {"json": kinds.SCHEMA}, "min_tokens": 1,
                    "ignore_eos": False},
}


def one(target, model: str, api_key: str | None, name: str, extra: dict, index: int) -> float:
    """Total seconds of one request of a variant (HTTP 200 required)."""
    nonce = os.urandom(6).hex()
    prompt = f"{nonce} variant {index}: " + " ".join(["warm"] * 24)
    body = dict(kinds.completion_body(model, prompt, f"variant-{nonce}", TOKENS, 0), **extra)
    started = time.monotonic()
    response = transport.fetch(target, transport.Clock.start(120, 60), "POST",
                               "/v1/completions", body, bearer=api_key)
    took = time.monotonic() - started
    if response.status != 200:
        raise SystemExit(f"variants.py: {name}: HTTP {response.status}")
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the server, without /v1")
    parser.add_argument("--model", help="the served model (default: the only one served)")
    parser.add_argument("--later", type=int, default=3, help="later requests per variant")
    args = parser.parse_args(argv)
    target = transport.parse_base_url(args.base_url)
    api_key = os.environ.get("VLLM_API_KEY") or None
    model = args.model
    if model is None:
        models = transport.fetch(target, transport.Clock.start(10, 10), "GET", "/v1/models",
                                 bearer=api_key)
        model = transport.decode_json(models.body)[0]["data"][0]["id"]
    print(f"{'variant':<26} {'first':>9} {'later (median)':>15} {'ratio':>7}")
    worst = 0.0
    for name, extra in VARIANTS.items():
        first = one(target, model, api_key, name, extra, 0)
        later = statistics.median(one(target, model, api_key, name, extra, i)
                                  for i in range(1, args.later + 1))
        worst = max(worst, first / later)
        print(f"{name:<26} {first * 1000:>7.0f} ms {later * 1000:>12.0f} ms {first / later:>6.2f}x")
    print(f"worst first/later: {worst:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
