"""Request kinds and the one judge: what each request is, and what makes its answer pass.

Plain data and pure functions, no I/O. Every request a program sends is a registered kind
(the contract's greedy completion, the --paths kinds, the probe's, the gate's copy); its
`Holds` says what its answer is held to; adding one is one decorated body builder here.
judge() is the one judge (the warm-up, the probe, the gate and contract.decide() call it).
"""

from __future__ import annotations

from core.values import Value
from core.records import ANSWER_FIELDS, clean_stop_reason
from core.cli import comma_list

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40}
SEED = 7
LOGPROBS = 5
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"},
                                           "name": {"type": "string"}},
          "required": ["id", "name"]}


class Holds(Value):
    """What an answer of a kind is held to."""
    tokens: str = "exact"         # "exact": N; "upto": 1..N (a grammar may end it); "any"
    finishes: tuple = ("length",)  # the finish reasons allowed; () any
    stop_null: bool = True        # stop_reason must be null
    usage: bool = True            # a usage object must come (in a stream: its last event)
    logprobs: bool = False        # log-probabilities must come (counted, never read)
    stream: bool = False          # streamed: it must end with [DONE]
    long_prompt: bool = False     # B1: more prompt tokens than its floor, none cached


EXACT = Holds()
STREAMED = Holds(stream=True)
STRUCTURED = Holds(tokens="upto", finishes=("length", "stop"))
COPY = Holds(tokens="any", finishes=(), stop_null=False, usage=False)


class Kind(Value):
    """One request kind: its name (in ids and records), the --paths name it belongs to
    (None: not a --paths kind), where it goes, and what its answer is held to."""
    name: str
    path: str | None
    endpoint: str
    holds: Holds
    build: object   # (model, prompt, rid, tokens, priority, template_kwargs) -> body

    @property
    def stream(self) -> bool:
        return self.holds.stream


KINDS: dict[str, Kind] = {}


def kind(name: str, endpoint: str, holds: Holds = EXACT, path: str | None = None):
    """Register the decorated body builder as a request kind."""
    def register(build):
        KINDS[name] = Kind(name, path, endpoint, holds, build)
        return build
    return register


@kind("greedy", COMPLETIONS)
def completion_body(model: str, prompt: str, rid: str, tokens: int, priority: int,
                    template_kwargs: dict | None = None) -> dict:
    """The contract's request: a raw completion, greedy, min = max, EOS ignored."""
    return {"model": model, "prompt": prompt, "max_tokens": tokens, "min_tokens": tokens,
            "ignore_eos": True, "temperature": 0, "priority": priority, "stream": False,
            "request_id": rid}


@kind("long", COMPLETIONS, Holds(long_prompt=True))
def long_body(model, prompt, rid, tokens, priority, template_kwargs=None):
    """B1: the contract's request with the long prompt, held to its own rules too."""
    return completion_body(model, prompt, rid, tokens, priority)


def chat_body(model: str, prompt: str, rid: str, tokens: int, priority: int,
              template_kwargs: dict | None) -> dict:
    """The same request through the model's chat template."""
    body = completion_body(model, prompt, rid, tokens, priority)
    body["messages"] = [{"role": "user", "content": body.pop("prompt")}]
    if template_kwargs is not None:
        body["chat_template_kwargs"] = template_kwargs
    return body


def streamed(body: dict) -> dict:
    return dict(body, stream=True, stream_options={"include_usage": True})


@kind("stream", COMPLETIONS, STREAMED, path="stream")
def stream_body(model, prompt, rid, tokens, priority, template_kwargs=None):
    """A streamed raw completion; usage comes in the last event (also the probe's item)."""
    return streamed(completion_body(model, prompt, rid, tokens, priority))


@kind("chat", CHAT, STREAMED, path="chat")
def chat_stream_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A streamed chat completion through the chat template (--chat-template-kwargs)."""
    return streamed(chat_body(model, prompt, rid, tokens, priority, template_kwargs))


# Sampling takes separate paths in vLLM's sampler: seeded, unseeded top-p/top-k, and plain
# temperature (GPU reports name each); the `sampled` path sends one of each.
@kind("sampled", COMPLETIONS, path="sampled")
def sampled_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A sampled completion: temperature 0.8, top_p 0.95, top_k 40, a fixed seed."""
    return dict(unseeded_body(model, prompt, rid, tokens, priority, template_kwargs),
                seed=SEED)


@kind("sampled-unseeded", COMPLETIONS, path="sampled")
def unseeded_body(model, prompt, rid, tokens, priority, template_kwargs):
    """The same top-p/top-k sampling without a seed."""
    return dict(completion_body(model, prompt, rid, tokens, priority), **SAMPLING)


@kind("sampled-temperature", COMPLETIONS, path="sampled")
def temperature_body(model, prompt, rid, tokens, priority, template_kwargs):
    """Plain temperature sampling (0.8): no top-p, no top-k, no seed."""
    return dict(completion_body(model, prompt, rid, tokens, priority),
                temperature=SAMPLING["temperature"])


@kind("logprobs", COMPLETIONS, Holds(logprobs=True), path="logprobs")
def logprobs_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A completion with the top 5 log-probabilities of every token and of every prompt
    token (prompt_logprobs: a path of its own in vLLM; counted, never read)."""
    return dict(completion_body(model, prompt, rid, tokens, priority), logprobs=LOGPROBS,
                prompt_logprobs=LOGPROBS)


@kind("logprobs-chat", CHAT, Holds(logprobs=True), path="logprobs")
def logprobs_chat_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A chat completion with logprobs and the top 5 of each token."""
    return dict(chat_body(model, prompt, rid, tokens, priority, template_kwargs),
                logprobs=True, top_logprobs=LOGPROBS)


@kind("json", CHAT, STRUCTURED, path="json")
def json_object_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A chat completion held to a JSON object (response_format json_object)."""
    return dict(chat_body(model, prompt, rid, tokens, priority, template_kwargs),
                response_format={"type": "json_object"})


@kind("json-schema", COMPLETIONS, STRUCTURED, path="json")
def json_schema_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A completion held to a small JSON schema (structured_outputs, vLLM 0.32)."""
    return dict(completion_body(model, prompt, rid, tokens, priority),
                structured_outputs={"json": SCHEMA})


COPY_STOP = "</text>"                 # where a raw completion's copy ends
COPY_SEED = 20240601


def copy_of(body: dict) -> dict:
    """A copy probe's body: greedy with a fixed seed, up to its budget, no floor."""
    for name in ("min_tokens", "ignore_eos", "priority"):
        del body[name]
    return dict(body, seed=COPY_SEED)


@kind("copy", CHAT, COPY)
def copy_chat_body(model, prompt, rid, tokens, priority, template_kwargs):
    """The gate's copy probe through the chat template: its text is scored by the gate,
    its HTTP and usage half judged here."""
    return copy_of(chat_body(model, prompt, rid, tokens, priority, template_kwargs))


@kind("copy-raw", COMPLETIONS, COPY)
def copy_raw_body(model, prompt, rid, tokens, priority, template_kwargs):
    """The gate's copy probe as a raw completion, stopped at the closing marker."""
    return dict(copy_of(completion_body(model, prompt, rid, tokens, priority)),
                stop=[COPY_STOP])


PATH_NAMES = tuple(dict.fromkeys(k.path for k in KINDS.values() if k.path))


def parse_paths(text: str) -> tuple[str, ...]:
    """'none' -> (); 'all' -> every path; 'chat,logprobs' -> those, in registry order.
    ValueError says what is wrong."""
    text = text.strip()
    if text in ("", "none"):
        return ()
    if text == "all":
        return PATH_NAMES
    names = comma_list(text, str, "path names separated by commas")
    unknown = [n for n in names if n not in PATH_NAMES]
    if unknown:
        raise ValueError(f"unknown path {unknown[0]!r}; paths: {', '.join(PATH_NAMES)}, all "
                         f"or none")
    return tuple(p for p in PATH_NAMES if p in names)


def kinds_of(paths: tuple[str, ...]) -> list[Kind]:
    """The kinds the paths send, in registry order."""
    return [k for k in KINDS.values() if k.path in paths]


def request_id(program: str, run_id: str, engine: int | None, *where) -> str:
    """The one request-id format: warmup-<run>-B2-1; with several engines
    warmup-<run>-e1-B2-1; probe-<run>-e0-single-r2-0; gate-<run>-alone-id_repo."""
    parts = [program, run_id] + ([] if engine is None else [f"e{engine}"])
    return "-".join(parts + [str(w) for w in where])


# The judge (pure).

def http_problem(answer: dict) -> str:
    """A non-200 answer named without a program's own diagnosis."""
    said = f": {answer['error']}" if isinstance(answer.get("error"), str) else ""
    return f"HTTP {answer.get('http_status')}{said}"


def judge(answer: dict, kind_: Kind, tokens: int, *, floor: int | None = None,
          diagnose=None) -> list[str]:
    """What makes one answer of a kind pass; [] when it passed.

    `answer` holds the fields vllm_client reads from a response (or answer_of() from a
    record). `floor`: the fewest prompt tokens of a long-prompt kind (B1), which also has
    none cached where reported. `diagnose(answer)` names a non-200 answer.
    """
    if answer.get("transport_error"):
        return [answer["transport_error"]]
    status = answer.get("http_status")
    if status != 200:
        said = (diagnose or http_problem)(answer) if status is not None else "no response"
        return [said if kind_.path is None else f"{kind_.name} rejected: {said}"]
    if answer.get("body_error"):
        return [answer["body_error"]]
    holds, problems = kind_.holds, []
    choices = answer.get("n_choices")
    if choices != 1:
        problems.append("response has no choices" if not choices
                        else f"response has {choices} choices, expected 1")
    if not answer.get("usage"):
        if holds.usage:
            problems.append("stream carried no usage" if holds.stream
                            else "response has no usage object")
    else:
        problems += list(answer.get("usage_problems") or ())
    problems += held_problems(answer, holds, tokens)
    if holds.long_prompt and answer.get("usage"):
        problems += long_prompt_problems(answer, floor or 0)
    return problems


def held_problems(answer: dict, holds: Holds, tokens: int) -> list[str]:
    """The answer's counts and reasons against what its kind is held to."""
    completion, finish, stop = (answer.get("completion_tokens"), answer.get("finish_reason"),
                                clean_stop_reason(answer.get("stop_reason")))
    counted = bool(answer.get("usage"))       # without usage no count is held, reasons are
    if counted and holds.tokens == "exact" and completion == 1 and tokens != 1:
        return [f"one-token response: completion_tokens 1 (finish_reason {said(finish)}, "
                f"stop_reason {said(stop)})"]          # one diagnosis, said once
    problems = []
    named = "completion_tokens" in (answer.get("usage_bad") or ()) or (
        "usage_bad" not in answer and bool(answer.get("usage_problems")))
    if counted and holds.tokens == "exact" and not named:
        if completion is None:
            problems.append("usage.completion_tokens missing")
        elif completion != tokens:
            problems.append(f"completion_tokens {said(completion)}, expected {tokens}")
    elif counted and holds.tokens == "upto" and not named:
        if completion is None or not 1 <= completion <= tokens:
            problems.append(f"completion_tokens {said(completion)}, expected 1 to {tokens} "
                            f"(structured output may end early)")
    if holds.finishes and finish not in holds.finishes:
        problems.append(f"finish_reason {said(finish)}, expected "
                        f"{' or '.join(repr(f) for f in holds.finishes)}")
    if holds.stop_null and stop is not None:
        problems.append(f"stop_reason {said(stop)}, expected null")
    if holds.logprobs and not answer.get("logprobs_count"):
        problems.append("no log-probabilities in the answer")
    if holds.stream and answer.get("stream_done") is not True:
        problems.append("stream did not end with [DONE]")
    if holds.stream and answer.get("first_token") is False:
        problems.append("no token text arrived")
    return problems


def said(value) -> str:
    """A recorded value as a problem names it: null as in the records, text quoted."""
    return "null" if value is None else repr(value)


def long_prompt_problems(answer: dict, floor: int) -> list[str]:
    """The long-prompt wave's rules: more prompt tokens than the floor allows below it, and
    none of them cached where the server reports it."""
    prompt, cached = answer.get("prompt_tokens"), answer.get("cached_tokens")
    problems = []
    if prompt is None:
        problems.append("usage.prompt_tokens missing: B1's size cannot be checked")
    elif prompt < floor:
        problems.append(f"B1 prompt_tokens {said(prompt)}, expected more than {floor - 1}")
    if cached is not None and cached != 0:
        problems.append(f"B1 cached_tokens {said(cached)}, expected 0: a cached prefix matched, "
                        f"so the long prefill did not run in full")
    return problems


def answer_of(record: dict) -> dict:
    """A request, probe or gate record as judge() reads an answer: what the record says
    the server answered (its `ok` is never read)."""
    answer = {name: record[name] for name in ANSWER_FIELDS}
    answer.update(n_choices=record["choices"], usage=record["usage"],
                  usage_problems=tuple(record["usage_problems"]))
    if record.get("http_status") is None:
        answer["transport_error"] = record.get("error") or "no response"
    return answer


def copy_problem(record: dict, max_cer: float, max_typos: int) -> str | None:
    """The gate's score rule on a scored copy: an identifier exact; a passage within
    `max_typos` word errors and `max_cer`. None when it holds."""
    if record.get("kind") == "identifier":
        return None if record.get("exact") is True else "not an exact copy"
    errors, cer = record.get("word_errors"), record.get("cer")   # a count, a finite number
    if errors is None or cer is None:
        return "no score"
    if errors > max_typos or not cer <= max_cer:
        return f"{errors} word error(s) (allowed {max_typos}), CER {cer} (bound {max_cer})"
    return None
