"""Request kinds beyond the greedy raw completion: each one a registered, named unit.

Above the vLLM client (transport <- ... <- vllm_client <- paths <- programs). A kind is
one function that builds its request body, registered with @kind: which --paths name it
belongs to, its endpoint, whether it is streamed, and what it is held to. Adding a kind
is one function here; the warm-up (--paths) and the probe (--paths) send every kind the
same way and judge it with judge_kind(), a pure function. Reading an answer stays in
vllm_client (extract_fields, extract_stream_fields): counts and reasons, never text.
"""

from __future__ import annotations

from dataclasses import dataclass

from prompts import completion_body

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "seed": 7}
LOGPROBS = 5
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer"},
                                           "name": {"type": "string"}},
          "required": ["id", "name"]}


@dataclass(frozen=True)
class Kind:
    """One request kind: its name (in ids and records), the --paths name it belongs to,
    where it goes, and what it is held to."""
    name: str
    path: str
    endpoint: str
    stream: bool
    structured: bool          # may end early on its grammar: 1..N tokens, length or stop
    logprobs: bool            # the answer must carry log-probabilities (counted, not read)
    build: object             # (model, prompt, rid, tokens, priority, template_kwargs) -> body


KINDS: dict[str, Kind] = {}


def kind(path: str, name: str, endpoint: str, stream: bool = False, structured: bool = False,
         logprobs: bool = False):
    """Register the decorated body builder as a request kind."""
    def register(build):
        KINDS[name] = Kind(name, path, endpoint, stream, structured, logprobs, build)
        return build
    return register


def chat_body(model: str, prompt: str, rid: str, tokens: int, priority: int,
              template_kwargs: dict | None) -> dict:
    """A chat request through the model's chat template, with the warm-up's budget."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens, "min_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "priority": priority, "stream": False, "request_id": rid}
    if template_kwargs is not None:
        body["chat_template_kwargs"] = template_kwargs
    return body


def streamed(body: dict) -> dict:
    return dict(body, stream=True, stream_options={"include_usage": True})


@kind("stream", "stream", COMPLETIONS, stream=True)
def stream_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A streamed raw completion; usage comes in the last event."""
    return streamed(completion_body(model, prompt, rid, tokens, priority))


@kind("chat", "chat", CHAT, stream=True)
def chat_stream_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A streamed chat completion through the chat template (--chat-template-kwargs)."""
    return streamed(chat_body(model, prompt, rid, tokens, priority, template_kwargs))


@kind("sampled", "sampled", COMPLETIONS)
def sampled_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A sampled completion: temperature 0.8, top_p 0.95, top_k 40, a fixed seed."""
    return dict(completion_body(model, prompt, rid, tokens, priority), **SAMPLING)


@kind("logprobs", "logprobs", COMPLETIONS, logprobs=True)
def logprobs_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A completion with the top 5 log-probabilities of every token."""
    return dict(completion_body(model, prompt, rid, tokens, priority), logprobs=LOGPROBS)


@kind("logprobs", "logprobs-chat", CHAT, logprobs=True)
def logprobs_chat_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A chat completion with logprobs and the top 5 of each token."""
    return dict(chat_body(model, prompt, rid, tokens, priority, template_kwargs),
                logprobs=True, top_logprobs=LOGPROBS)


@kind("json", "json", CHAT, structured=True)
def json_object_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A chat completion held to a JSON object (response_format json_object)."""
    return dict(chat_body(model, prompt, rid, tokens, priority, template_kwargs),
                response_format={"type": "json_object"})


@kind("json", "json-schema", COMPLETIONS, structured=True)
def json_schema_body(model, prompt, rid, tokens, priority, template_kwargs):
    """A completion held to a small JSON schema (structured_outputs, vLLM 0.32)."""
    return dict(completion_body(model, prompt, rid, tokens, priority),
                structured_outputs={"json": SCHEMA})


PATH_NAMES = tuple(dict.fromkeys(k.path for k in KINDS.values()))


def parse_paths(text: str) -> tuple[str, ...]:
    """'none' -> (); 'all' -> every path; 'chat,logprobs' -> those, in registry order.
    ValueError says what is wrong."""
    text = text.strip()
    if text in ("", "none"):
        return ()
    if text == "all":
        return PATH_NAMES
    names = [n.strip() for n in text.split(",")]
    unknown = [n for n in names if n not in PATH_NAMES]
    if unknown:
        raise ValueError(f"unknown path {unknown[0]!r}; paths: {', '.join(PATH_NAMES)}, all "
                         f"or none")
    return tuple(p for p in PATH_NAMES if p in names)


def kinds_of(paths: tuple[str, ...]) -> list[Kind]:
    """The kinds the paths send, in registry order."""
    return [k for k in KINDS.values() if k.path in paths]


def judge_kind(fields: dict, kind_: Kind, tokens: int, diagnose) -> list[str]:
    """What makes one answer of a kind pass; [] when it passed. `diagnose(fields)` names
    a non-200 answer. Pure: fields from vllm_client's readers."""
    if fields.get("transport_error"):
        return [fields["transport_error"]]
    if fields["http_status"] != 200:
        return [f"{kind_.name} rejected: {diagnose(fields)}"]
    if fields["body_error"]:
        return [fields["body_error"]]
    problems = []
    if fields["n_choices"] != 1:
        problems.append(f"response has {fields['n_choices'] or 'no'} choices, expected 1")
    if not fields["usage"]:
        return problems + ["response has no usage object" if not kind_.stream
                           else "stream carried no usage"]
    problems += fields.get("usage_problems", [])
    completion, finish = fields["completion_tokens"], fields["finish_reason"]
    if kind_.structured:                  # the grammar may end the answer early
        if completion is None or not 1 <= completion <= tokens:
            problems.append(f"completion_tokens {completion}, expected 1 to {tokens} "
                            f"(structured output may end early)")
        if finish not in ("length", "stop"):
            problems.append(f"finish_reason {finish!r}, expected 'length' or 'stop'")
    else:
        if completion != tokens:
            problems.append(f"completion_tokens {completion}, expected {tokens}")
        if finish != "length":
            problems.append(f"finish_reason {finish!r}, expected 'length'")
        if fields["stop_reason"] is not None:
            problems.append(f"stop_reason {fields['stop_reason']!r}, expected null")
    if kind_.logprobs and not fields.get("logprobs_count"):
        problems.append("no log-probabilities in the answer")
    if kind_.stream and fields.get("stream_done") is False:
        problems.append("stream did not end with [DONE]")
    return problems
