"""The quality gate (qualify.py gate): can the served model copy text exactly?

Six identifiers must come back exactly and an English and a Russian passage within the
error bound, each probe alone and then batched, on every engine, behind the guard.
Scoring is pure (score_answer, levenshtein); the answer text never leaves gate_record().
"""

from __future__ import annotations

import argparse
import re
import textwrap
import unicodedata

from core.values import Value
from core.cli import emit, number_type, whole
from core.records import typed
from core.runframe import Run, RunSettings, add_run_options
from core.sanitize import REDACTIONS, clean_text
from core.transport import UsageError, decode_json
from core.kinds import COPY_SEED as GATE_SEED
from core.kinds import COPY_STOP, KINDS, copy_problem, judge, request_id
from core.vllm_client import (ENVIRONMENT_HELP, Connection, ServerProgram, Slot,
                              add_server_options, answer_record, connection_from,
                              diagnose_http_error, read_slot, server_main, slot_timing,
                              template_kwargs_type)
from tools.lines import gate_line, gate_summary_line

PROG = "qualify.py gate"

# gate: can the model copy text exactly? Six identifiers and two passages, alone and in
# one batch, greedy; scored in memory; records keep counts and distances, never text.

class GateOptions(Value):
    endpoint: str
    max_tokens: int
    max_cer: float
    template_kwargs: dict | None
    max_typos: int = 0


class Probe(Value):
    name: str
    kind: str                         # "identifier" or "passage"
    reference: str


# Our own text, written for this gate. Identifiers of the kinds operators type: mixed
# case, digits and - _ . / : (a model repo id, a config key, a hex digest, a path, a
# version tag, a flag).
IDENTIFIERS = (
    ("id_repo", "Gullpoint-Labs/Ferry-7B_Instruct.v2"),
    ("id_config_key", "ferry.tideTable.max_depth_cm:420"),
    ("id_digest", "sha256:7c41e0b9d2a35f68c09e1b74a2d8f3c6"),
    ("id_path", "/srv/gullpoint/ckpt/run-0419_B/shard-003.safetensors"),
    ("id_version", "v2.14.0-rc.3+build.7f3a9c"),
    ("id_flag", "--rope-scaling=yarn:factor_4.0"),
)

PASSAGE_EN = """\
The weather station on Gull Point was built in the spring of a dry year, when the road \
from the village still ended at the old quarry. Two engineers carried the first \
instruments up the hill by hand: a wind vane, a rain gauge with a copper funnel, and a \
thermometer screen painted white so that the sun would not warm the air inside it. For \
the first month they slept in a tent beside the mast and wrote every reading twice, once \
in a paper log and once on a card that went down to the village with the baker's van.

The readings were plain numbers, but the engineers learned to trust them only after they \
had been checked. A gust of wind could shake the vane loose; a spider could build its web \
across the funnel; a careless visitor could lean on the screen and leave it tilted toward \
the south. Each morning began with a walk around the mast, a look at every joint and \
screw, and a short note about anything that had changed during the night.

Years later the station was given a small computer, a solar panel and a radio link to the \
city. The paper log was kept anyway. The new system sent its figures every ten minutes, \
and most days they agreed with the old instruments to the last decimal place. On the days \
they did not, someone climbed the hill to find out why, and usually the answer was \
ordinary: a loose cable, a battery that had grown tired in the cold, a bird that had \
chosen the warmest corner of the roof.

Visitors sometimes asked why anyone still bothered to copy numbers by hand. The answer \
written on the first page of the log was short: a record is only useful if you can tell \
when it is wrong, and the only way to know is to compare it with something you trust."""

PASSAGE_RU = """\
Паром через северную реку ходит с середины мая до первых заморозков. Утром, когда над \
водой ещё стоит туман, паромщик проверяет трос, смазывает блоки и записывает в тетрадь \
уровень реки по старой рейке у причала. Эту тетрадь завели задолго до него, и в ней можно \
найти записи о половодьях, о сухих годах и о том дне, когда лёд сошёл на две недели \
раньше обычного.

Первые пассажиры приезжают к семи часам: почтальон на велосипеде, фермер с молоком для \
сыроварни, учительница, которая живёт на одном берегу, а работает на другом. Переправа \
занимает двенадцать минут, если ветер спокойный, и почти двадцать, если он дует против \
течения. За это время люди успевают обменяться новостями, договориться о ремонте крыши \
или просто помолчать, глядя на воду.

Несколько лет назад на пароме поставили датчики, которые сами измеряют глубину, скорость \
течения и температуру воды. Данные уходят по радио в районный центр, и там по ним \
составляют прогноз для рыбаков и речников. Паромщик всё равно продолжает вести тетрадь. \
Он говорит, что прибор может ошибиться так же, как человек, только об ошибке прибора \
никто не узнает, если её не с чем сравнить.

Однажды осенью датчик показал, что уровень реки за ночь упал почти на метр. В районе уже \
готовили предупреждение о мели, но паромщик спустился к рейке и увидел, что вода стоит \
там же, где вчера. Оказалось, что на датчик налипли листья и ил. Его почистили, и цифры \
снова совпали с тетрадью.

С тех пор в районном центре каждую неделю сверяют показания датчиков с записями \
паромщика. Эта простая проверка занимает несколько минут и не раз помогала найти \
неисправность раньше, чем она становилась бедой.

Зимой, когда паром стоит на берегу, тетрадь хранится в доме паромщика на полке рядом с \
картами реки. Весной он первым делом открывает её на чистой странице, пишет дату и снова \
идёт к рейке, чтобы посмотреть, как высоко поднялась вода."""

PROBES = tuple(Probe(name, "identifier", text) for name, text in IDENTIFIERS) + (
    Probe("passage_en", "passage", PASSAGE_EN),
    Probe("passage_ru", "passage", PASSAGE_RU),
)
SHAPES = ("alone", "batched")
ENDPOINTS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
COPY_OPEN, COPY_CLOSE = "<text>", COPY_STOP
COPY_KINDS = {"chat": KINDS["copy"], "completions": KINDS["copy-raw"]}
INSTRUCTION = (f"Reply with exactly the text between {COPY_OPEN} and {COPY_CLOSE}, character "
               f"for character, and nothing else: no quotes, no tags, no comments.")
GATE_MAX_TOKENS = 2048
GATE_MAX_CER = 0.01
INTRO_LINE_LIMIT = 120                # a longer first line is not "only an introduction"
THINKING_OFF = '{"enable_thinking": false}'


def gate_prompt(reference: str, endpoint: str) -> str:
    """The instruction and the text between markers; a raw completion ends inside the
    opening marker, so a base model continues with the copy (and stops at the close)."""
    prompt = f"{INSTRUCTION}\n{COPY_OPEN}\n{reference}\n{COPY_CLOSE}"
    if endpoint == "completions":
        prompt += f"\n\nThe exact copy:\n{COPY_OPEN}\n"
    return prompt


# -- scoring: pure functions ------------------------------------------------

_FENCE_OPEN = re.compile(r"```[\w+.-]*[ \t]*")
_QUOTES = ("\"", "'", "`")


def unwrap(answer: str) -> tuple[str, list[str]]:
    """Remove what chat models wrap around a faithful answer and is not garbling: a first
    line that only introduces it and ends with a colon, a surrounding code fence.

    Returns the answer and the names of what was removed (never the removed text).
    """
    removed = []
    text = answer.strip()
    for _ in range(2):                          # "Here it is:" then a fence, or the reverse
        first, newline, rest = text.partition("\n")
        if newline and rest.strip() and first.rstrip().endswith(":") \
                and len(first) <= INTRO_LINE_LIMIT and "intro line" not in removed:
            removed.append("intro line")
            text = rest.strip()
            continue
        lines = text.split("\n")
        if len(lines) >= 3 and _FENCE_OPEN.fullmatch(lines[0].strip()) \
                and lines[-1].strip() == "```" and "code fence" not in removed:
            removed.append("code fence")
            text = "\n".join(lines[1:-1]).strip()
            continue
        break
    return text, removed


def clean_identifier(answer: str) -> str:
    """An identifier answer without surrounding whitespace, one pair of surrounding quotes
    or backticks, and a trailing period (outside or inside the quotes, once)."""
    text = answer.strip()
    period = text.endswith(".")
    if period:
        text = text[:-1].rstrip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in _QUOTES:
        text = text[1:-1]
    if not period and text.endswith("."):
        text = text[:-1]
    return text


def collapse(text: str) -> str:
    """Runs of whitespace as one space, none at the ends."""
    return " ".join(text.split())


# Typography a model may change without garbling the text: curly quotes, dashes, the
# ellipsis and a non-breaking space become their ASCII forms.
TYPOGRAPHY = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
                            "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"',
                            "\u2010": "-", "\u2011": "-", "\u2012": "-", "\u2013": "-",
                            "\u2014": "-", "\u2015": "-", "\u2212": "-",
                            "\u2026": "...", "\u00a0": " "})
COPY_START_WORDS = 4                   # a passage's copy starts where its first words stand
PREAMBLE_LINES = 64                    # a preamble longer than this is not looked past


def normalize(text: str) -> str:
    """The one normalization before a passage is scored: Unicode NFC, typographic quotes,
    dashes and the ellipsis as ASCII, runs of whitespace (line breaks too) as one space,
    none at the ends (so a trailing newline is nothing)."""
    return collapse(unicodedata.normalize("NFC", text).translate(TYPOGRAPHY))


def find_copy(probe: Probe, text: str) -> tuple[str, int]:
    """(the copy, how many characters of preamble stood before it).

    A model whose chat template ignores `thinking: false` writes its plan first. The copy
    of an identifier is the last non-empty line (the lines before it are the preamble);
    the copy of a passage starts at the first line that begins with the passage's first
    COPY_START_WORDS words. A one-line identifier answer, or a passage whose start is not
    found at a line's start, is all copy."""
    if probe.kind == "identifier":
        lines = [line for line in text.strip().split("\n") if line.strip()]
        if len(lines) < 2:
            return text, 0
        return lines[-1], len("\n".join(lines[:-1]))
    head = normalize(probe.reference).split(" ")[:COPY_START_WORDS]
    offset = 0
    for line in text.split("\n", PREAMBLE_LINES)[:PREAMBLE_LINES]:
        if normalize(text[offset:offset + 4096]).split(" ")[:len(head)] == head:
            return text[offset:], len(normalize(text[:offset]))
        offset += len(line) + 1
    return text, 0


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), exact, in O(len(a)) big-integer
    steps: Myers' bit-parallel algorithm (Hyyrö's formulation); 2,000 x 2,000 in ms."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    m = len(b)
    peq: dict[str, int] = {}
    for i, ch in enumerate(b):
        peq[ch] = peq.get(ch, 0) | (1 << i)
    full, top = (1 << m) - 1, 1 << (m - 1)
    pv, mv, score = full, 0, m
    for ch in a:
        eq = peq.get(ch, 0)
        xv = eq | mv
        xh = (((eq & pv) + pv) ^ pv) | eq
        ph = mv | (~(xh | pv) & full)
        mh = pv & xh
        if ph & top:
            score += 1
        elif mh & top:
            score -= 1
        ph = ((ph << 1) | 1) & full
        mh = (mh << 1) & full
        pv = mh | (~(xv | ph) & full)
        mv = ph & xv
    return score


def score_answer(probe: Probe, answer: str, max_cer: float, max_typos: int = 0) -> dict:
    """The answer against the reference: counts and distances only, never the text.

    What wraps a faithful answer is removed first (unwrap), then a preamble (find_copy:
    counted, never scored). Identifiers: exact after clean_identifier. Passages, after
    normalize(): at most `max_typos` word errors (words substituted, inserted or deleted)
    and a character error rate (edit distance / reference length) at most `max_cer`.
    """
    text, removed = unwrap(answer)
    text, preamble = find_copy(probe, text)
    if probe.kind == "identifier":
        got, want = clean_identifier(text), probe.reference
    else:
        got, want = normalize(text), normalize(probe.reference)
    distance = levenshtein(got, want)
    cer = round(distance / len(want), 6)
    exact = got == want
    word_errors = None if probe.kind == "identifier" else \
        levenshtein(got.split(" ") if got else [], want.split(" "))
    exact = exact if probe.kind == "identifier" else None
    ok = copy_problem({"kind": probe.kind, "exact": exact, "word_errors": word_errors,
                       "cer": cer}, max_cer, max_typos) is None
    return {"exact": exact, "edit_distance": distance,
            "reference_chars": len(want), "answer_chars": len(got), "cer": cer,
            "word_errors": word_errors,
            "reference_words": None if word_errors is None else len(want.split(" ")),
            "preamble_chars": preamble, "removed": removed, "ok": ok, "empty": not got}


def score_problem(probe: Probe, score: dict, max_cer: float, max_typos: int = 0
                  ) -> str | None:
    """Why a scored answer failed, in figures; None when it passed."""
    if score["ok"]:
        return None
    figures = (f"edit distance {score['edit_distance']} of {score['reference_chars']} "
               f"characters")
    if score["empty"]:
        return f"empty answer ({figures})"
    if probe.kind == "identifier":
        return f"not an exact copy ({figures})"
    return (f"{score['word_errors']} word error(s) of {score['reference_words']} words "
            f"(allowed: {max_typos}), CER {score['cer']:.4f} (bound {max_cer:g}; {figures})")


# -- one response -> one record ---------------------------------------------

def read_answer(body: bytes, endpoint: str) -> tuple[str | None, bool, str | None]:
    """(the answer, whether a reasoning part came with it, a problem) of a 200 body.

    The answer is message.content (chat) or text (completions); a reasoning part is not
    the answer. The text stays in memory: the caller scores it and drops it.
    """
    doc, why = decode_json(body)
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if why is not None or not isinstance(choices, list) or not choices \
            or not isinstance(choices[0], dict):
        return None, False, (f"{why} in the response body" if why
                             else "response has no choices")
    choice = choices[0]
    if endpoint == "chat":
        message = choice.get("message")
        if not isinstance(message, dict):
            return None, False, "response choice has no message"
        reasoning = message.get("reasoning") or message.get("reasoning_content")
        content = message.get("content")
        has_reasoning = isinstance(reasoning, str) and bool(reasoning.strip())
        if content is None:
            return "", has_reasoning, None
        if not isinstance(content, str):
            return None, has_reasoning, "message.content is not text"
        return content, has_reasoning, None
    text = choice.get("text")
    if not isinstance(text, str):
        return None, False, "response choice has no text"
    return text, False, None


def diagnose_gate_error(status: int, message: str | None, param: str | None,
                        connection: Connection, endpoint: str) -> str:
    """Why a probe request was refused, and what to do about it."""
    text = f"{message or ''} {param or ''}".lower()
    said = f": {message}" if message else ""
    if status == 400 and endpoint == "chat" and ("template" in text or "chat_template" in text):
        return (f"the server could not apply its chat template (HTTP 400): for a base model "
                f"run the gate with --endpoint completions; otherwise check "
                f"--chat-template-kwargs, or start the server with --chat-template FILE{said}")
    if status == 400 and ("context length" in text or "input_tokens" in text
                          or "max_tokens" in text):
        return (f"a probe does not fit the model's context (its prompt plus --max-tokens must "
                f"not exceed max_model_len; lower --max-tokens) (HTTP 400){said}")
    if status == 404:
        return (f"HTTP 404: the server has no {ENDPOINTS[endpoint]} (a base model without a "
                f"chat endpoint? try --endpoint completions; is --base-url the server "
                f"itself?){said}")
    return diagnose_http_error(status, message, param, connection.api_key_env,
                               bool(connection.api_key))


def exhausted_problem(reasoning_tokens: int | None, max_tokens: int) -> str:
    spent = f"its {reasoning_tokens} " if reasoning_tokens is not None else "its "
    return (f"empty answer: the model spent {spent}completion tokens on reasoning and ran "
            f"out (finish_reason length); raise --max-tokens (now {max_tokens}) or turn its "
            f"thinking off, e.g. --chat-template-kwargs '{THINKING_OFF}'")


def gate_record(run: Run, connection: Connection, probe: Probe, index: int, shape: str,
                slot: Slot, options: GateOptions) -> dict:
    """One probe's response: its HTTP and usage half judged by kinds.judge(), its answer
    scored in memory; counts, distances and reasons are kept, the answer is dropped."""
    timing, answer = slot_timing(slot), read_slot(slot)

    def diagnose(fields: dict) -> str:
        return diagnose_gate_error(fields["http_status"], fields["error"],
                                   fields["error_param"], connection, options.endpoint)
    problems = judge(answer, COPY_KINDS[options.endpoint], options.max_tokens,
                     diagnose=diagnose)
    score = {}
    if not problems:
        text, reasoned, why = read_answer(slot.exchange.response.body, options.endpoint)
        if why is not None:
            problems.append(why)
        else:
            score = score_answer(probe, text, options.max_cer, options.max_typos)
            problems += answer_problems(probe, score, answer, reasoned, options)
        del text                          # the text goes no further than this function
    return {
        "record": "gate", "run_id": run.settings.run_id, "request_id": slot.request_id,
        "request_kind": COPY_KINDS[options.endpoint].name,
        "probe": probe.name, "kind": probe.kind,
        "shape": shape, "index": index, "engine": slot.engine, **answer_record(answer),
        "exact": score.get("exact"), "edit_distance": score.get("edit_distance"),
        "reference_chars": score.get("reference_chars", len(probe.reference)),
        "answer_chars": score.get("answer_chars"), "cer": score.get("cer"),
        "word_errors": score.get("word_errors"), "reference_words": score.get("reference_words"),
        "preamble_chars": score.get("preamble_chars"),
        "removed": score.get("removed", []),
        "latency_s": timing["latency_s"], "sent_at_s": timing["sent_at_s"],
        "ok": not problems,
        "problems": problems,
    }


def answer_problems(probe: Probe, score: dict, answer: dict, reasoned: bool,
                    options: GateOptions) -> list[str]:
    """Why a scored answer failed: a reasoning model that ran out of tokens, or the score
    in figures (and whether the answer was cut)."""
    finish = answer["finish_reason"]
    if score["empty"] and finish == "length" and (reasoned or answer["reasoning_tokens"]):
        return [exhausted_problem(answer["reasoning_tokens"], options.max_tokens)]
    problem = score_problem(probe, score, options.max_cer, options.max_typos)
    if problem and finish == "length":
        problem += (f"; the answer was cut at --max-tokens {options.max_tokens} "
                    f"(finish_reason length)")
    return [problem] if problem else []


# -- the run ---------------------------------------------------------------

def gate_figures(records: list[dict], engines: int) -> dict:
    """The gate's figures over its records: identifiers exact per shape, the worst CER."""
    exact = {}
    for shape in SHAPES:
        hits = sum(1 for r in records if r["shape"] == shape and r["exact"] is True)
        exact[shape] = f"{hits}/{len(IDENTIFIERS) * engines}"
    cers = [r["cer"] for r in records if r["kind"] == "passage" and r["cer"] is not None]
    typos = [r["word_errors"] for r in records
             if r["kind"] == "passage" and r.get("word_errors") is not None]
    passages = [r for r in records if r["kind"] == "passage"]
    return {"identifiers_exact": exact, "worst_cer": max(cers) if cers else None,
            "worst_typos": max(typos) if typos else None,
            "passages_ok": f"{sum(r['ok'] for r in passages)}/"
                           f"{len(SHAPES) * 2 * engines}",
            "preambles": sorted({f"{r['shape']} {r['probe']}" for r in records
                                 if r.get("preamble_chars")})}


class Gate(ServerProgram):
    """Every probe alone (one after another), then all together in one batch, on every
    engine; scored in memory, recorded as counts and distances."""

    mode = "gate"

    def __init__(self, connection: Connection, options: GateOptions, settings: RunSettings):
        super().__init__(connection)
        self.options = options
        self.settings = settings
        for _, identifier in IDENTIFIERS:    # never in any output, whole or in part
            REDACTIONS.secret(identifier)

    def planned_per_engine(self) -> int:
        return len(PROBES) * len(SHAPES)

    def plan_fields(self) -> dict:
        options = self.options
        return {
            "probes": [{"probe": p.name, "kind": p.kind,
                        "reference_chars": len(collapse(p.reference))} for p in PROBES],
            "shapes": list(SHAPES), "endpoint": options.endpoint,
            "path": ENDPOINTS[options.endpoint], "max_tokens": options.max_tokens,
            "max_cer": options.max_cer, "max_typos": options.max_typos, "temperature": 0,
            "seed": GATE_SEED,
            "chat_template_kwargs": options.template_kwargs,
            "deadline_s": self.settings.deadline_s, "socket_cap_s": self.settings.socket_cap_s}

    def steps(self, run: Run) -> None:
        options = self.options
        self.learn_server(run)
        run.write_run_record()
        run.say(f"gate {run.settings.run_id}: {self.connection.target.display} model "
                f"{clean_text(self.server.model or '', 80)}, endpoint {options.endpoint}, "
                f"{len(PROBES)} probes alone then batched, max CER {options.max_cer:g}, "
                f"deadline {run.settings.deadline_s:g} s")
        for index, probe in enumerate(PROBES):
            if not self.batch(run, "alone", [(index, probe)], index == 0):
                return
        self.batch(run, "batched", list(enumerate(PROBES)), False)

    def summary_fields(self, run: Run) -> dict:
        return dict(super().summary_fields(run),
                    **gate_figures(self.tally.requests, len(self.server.engines)))

    def exported(self, run: Run, summary: dict) -> list[tuple]:
        """Identifiers exact per shape, passages ok, the worst character error rate."""
        records = self.tally.requests
        engines = len(self.server.engines)
        samples = [("offload_gate_identifiers_exact", {"shape": shape},
                    float(sum(1 for r in records if r["shape"] == shape and r["exact"] is True)),
                    "Identifiers copied exactly in the last gate, per shape.")
                   for shape in SHAPES]
        samples += [("offload_gate_identifiers_total", {"shape": shape},
                     float(len(IDENTIFIERS) * engines), "Identifiers probed, per shape.")
                    for shape in SHAPES]
        passages = [r for r in records if r["kind"] == "passage"]
        samples.append(("offload_gate_passages_ok", {}, float(sum(r["ok"] for r in passages)),
                        "Passages within the error bound in the last gate."))
        samples.append(("offload_gate_passages_total", {}, float(len(SHAPES) * 2 * engines),
                        "Passages probed."))
        worst = gate_figures(records, engines)["worst_cer"]
        if worst is not None:
            samples.append(("offload_gate_worst_cer_ratio", {}, float(worst),
                            "The worst passage's character error rate (0 to 1)."))
        return samples

    def after_summary(self, run: Run, summary: dict) -> dict:
        """The gate_summary, right after the run's summary however the run ended (pass,
        fail, refused, killed); --json prints it instead of the summary."""
        record = gate_summary_record(summary, run.settings.run_id, self.options,
                                     run.settings.records_path)
        run.say(gate_summary_line(typed(record)))
        return record

    def batch(self, run: Run, shape: str, probes: list[tuple[int, Probe]], first: bool
              ) -> bool:
        """Send these probes together (on every engine), score and record them; False when
        refused by the guard or the deadline."""
        options = self.options
        label = f"gate {shape}" + (f" {probes[0][1].name}" if len(probes) == 1 else "")
        if run.clock.remaining() <= 0:
            self.tally.problems.append(f"deadline passed before {label}")
            return False
        slots = []
        for engine in self.server.engines:
            for index, probe in probes:
                rid = request_id("gate", run.settings.run_id, engine, shape, probe.name)
                slots.append(self.make_slot(
                    COPY_KINDS[options.endpoint], index, rid, engine,
                    gate_prompt(probe.reference, options.endpoint), options.max_tokens, 0,
                    options.template_kwargs, tagged=False))
        finished = self.guarded_batch(run, label, slots, first=first)
        if finished is None:
            return False
        for slot in finished:
            record = gate_record(run, self.connection, PROBES[slot.index], slot.index, shape,
                                 slot, options)
            run.write(record)
            self.tally.requests.append(record)
            run.say(gate_line(typed(record)))
        return True


def gate_summary_record(summary: dict, run_id: str, options: GateOptions,
                        records_path: str | None) -> dict:
    """The gate_summary: the run's own summary (verdict, exit code, problems) with the
    gate's figures, so the two always agree."""
    return {
        "record": "gate_summary", "run_id": run_id,
        "verdict": summary["verdict"], "exit_code": summary["exit_code"],
        "identifiers_exact": summary.get("identifiers_exact",
                                         {shape: f"0/{len(IDENTIFIERS)}" for shape in SHAPES}),
        "worst_cer": summary.get("worst_cer"), "passages_ok": summary.get("passages_ok"),
        "worst_typos": summary.get("worst_typos"), "max_typos": options.max_typos,
        "preambles": summary.get("preambles", []),
        "max_cer": options.max_cer, "endpoint": options.endpoint,
        "elapsed_s": summary.get("elapsed_s"),
        "problems": summary["problems"],
        "records": records_path,
    }


fraction = number_type(float, lambda v: 0 <= v <= 1, "must be a number from 0 to 1",
                       "fraction")      # an argparse type


GATE_EPILOG = """\
what it proves, and what it cannot:
  A model that garbles text (typos, swapped or dropped characters), a random or wrong
  model, a broken chat template, or a build that garbles only when requests are batched
  fails it. Passing it proves exact copying, nothing more: not answer quality, not
  reasoning, not speed. The answers are scored in memory; records keep counts and
  distances (word errors, edit distance, CER), never the answer or the reference text.

how a passage is scored:
  After one normalization (Unicode NFC; curly quotes, dashes and the ellipsis as ASCII;
  runs of whitespace as one space; no trailing newline) the copy is compared word by word:
  a substituted, inserted or deleted word is a word error ("typo"). A passage passes with
  at most --max-typos word errors (default 0: one typo fails it) and a character error
  rate at most --max-cer. Identifiers must be exact.
  Text before the copy (a plan written by a model whose template ignores "thinking off")
  is a preamble: an identifier's copy is the answer's last line, a passage's starts at
  the first line that begins with its first four words; the preamble is counted
  (preamble_chars) and named in the summary, never scored.

exit status: warmup.py --help's table (CONTRACT.md section 9).
--json prints the gate_summary record on stdout as one JSON object: verdict, exit_code,
identifiers_exact ({"alone": "6/6", "batched": "6/6"}), worst_typos and worst_cer
(numbers or null), preambles, problems; the human lines go to stderr.
"""


def build_gate_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog=PROG, epilog=GATE_EPILOG + "\n" + ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "The quality gate: can the served model copy text exactly? Six "
                    "identifiers (a repo id, a config key, a digest, a path, a version tag, "
                    "a flag) must come back exactly, and an English and a Russian passage of "
                    "about 300 words without a typo (--max-typos), each probe "
                    "once alone and once with all the others in one batch, greedy "
                    "(temperature 0, a fixed seed). Same connection options, API key, guards, "
                    "deadline and records as the warm-up.", 79))
    add_server_options(parser)
    add_run_options(parser, deadline_s=175.0)   # within start.sh's 180 s bound for the gate
    for action in parser._actions:        # the gate prints its gate_summary, not the summary
        if action.dest == "json":
            action.help = ("print the gate_summary record as one JSON object on stdout (also "
                           "on a usage error); the human lines go to stderr")
    parser.add_argument("--endpoint", choices=tuple(ENDPOINTS), default="chat",
                        help="chat: /v1/chat/completions, the server's chat template applies, "
                             "as for real users; completions: raw /v1/completions, for base "
                             "models (default: %(default)s)")
    parser.add_argument("--chat-template-kwargs", metavar="JSON", type=template_kwargs_type,
                        help=f"a JSON object passed to the chat template, e.g. "
                             f"'{THINKING_OFF}' to turn a model's thinking off")
    parser.add_argument("--max-tokens", metavar="N", type=whole(64, 65536),
                        default=GATE_MAX_TOKENS,
                        help="completion tokens each probe may use; raise it for reasoning "
                             "models (default: %(default)s)")
    parser.add_argument("--max-typos", metavar="N", type=whole(0, 1000), default=0,
                        help="word errors a passage may have and pass (default: %(default)s: "
                             "clean means no typo)")
    parser.add_argument("--max-cer", metavar="F", type=fraction, default=GATE_MAX_CER,
                        help="the highest character error rate a passage may have, besides "
                             "--max-typos (default: %(default)g)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan and exit 0 without touching the network")
    return parser


def gate_main(argv: list[str]) -> int:
    """qualify.py gate: every probe alone, then all in one batch; exit 0 only if all pass."""
    return server_main(build_gate_parser(), argv, PROG, "gate", build_gate)


def build_gate(args: argparse.Namespace, settings: RunSettings):
    """The parsed options -> (the Gate, its dry run); UsageError naming a bad value."""
    if args.chat_template_kwargs is not None and args.endpoint != "chat":
        raise UsageError("--chat-template-kwargs needs --endpoint chat")
    options = GateOptions(args.endpoint, args.max_tokens, args.max_cer,
                          args.chat_template_kwargs, args.max_typos)
    connection = connection_from(args)

    def print_plan():
        emit(f"gate plan for {connection.target.display}: {len(IDENTIFIERS)} identifiers and "
             f"2 passages, each alone then all in one batch ({len(PROBES) * len(SHAPES)} "
             f"requests per engine) on {ENDPOINTS[args.endpoint]}; greedy, max_tokens "
             f"{args.max_tokens}, max CER {args.max_cer:g}; deadline "
             f"{settings.deadline_s:g} s")
    return Gate(connection, options, settings), print_plan
