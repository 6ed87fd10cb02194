"""The one home of the records: each kind's fields and types (CONTRACT.md's table). Run.write()
holds each record to them; held() reads a file's, leaving out (and naming) one that breaks
them and typing the rest (a class per kind, each field an attribute: read without a check).
`name:type?` may be null, `~name` absent. Types: str, int, num, count (0 to 2**53), finite
(a finite number, 0 or more), bool, list, dict, any; list[T] and dict[T] hold T (T? may be
null); @name, a SHAPES object."""

from __future__ import annotations

import json
import math
import re

from core.sanitize import clean_text

DESCRIBED = re.compile(r"<(a token id|a string of [0-9]{1,9} characters|[a-z]{1,10})>")

SHOW_LIMIT = 80                       # one value in a table or a line

FORMAT = 2                            # the run record's `format`: what this layout is

_ANSWER = ("http_status:int? choices:int? usage:bool body_error:str? prompt_tokens:count? "
           "completion_tokens:count? cached_tokens:count? reasoning_tokens:count? "
           "finish_reason:str? stop_reason:any stream_done:bool? first_token:bool? "
           "logprobs_count:count? usage_problems:list[str] error:str?")

DECLARED = {
    "run": "run_id:str mode:str format:int started_at:str base_url:str "
           "model:str? max_model_len:int? engines:list[int]? plan:@plan versions:dict "
           "process_start_time_seconds:finite? ~spec_positions:int? api_key_env:str "
           "api_key_set:bool pid:int",
    "gauges": "run_id:str wave:str at_s:num ok:bool samples:list[@sample] fresh_engines:list "
              "settle_s:num? problems:list[str] ~sleep_state:dict[str]?",
    "request": "run_id:str request_id:str request_kind:str wave:str ~path:str depth:int "
               "index:int engine:int? " + _ANSWER + " latency_s:finite? sent_at_s:finite? ok:bool "
               "problems:list[str] metrics:dict? speculative_decoding:dict?",
    "wave": "run_id:str wave:str ~path:str depth:int engine:int? release_skew_ms:num? "
            "batch_release_skew_ms:num? duration_s:finite started_at_s:finite "
            "released_at:str? last_answer_at:str? ok:bool requests_ok:int problems:list[str] "
            "~counters:dict ~counters_cut:int? ~counters_went_down:list[str] ~counters_why:str? "
            "~running_max:num? ~waiting_max:num? ~gauge_samples:int ~gauge_reads:int? "
            "~gauge_reads_failed:int? ~spec_decode:@spec? ~tokens_per_step:num?",
    "metrics": "run_id:str source:str state:str why:str? meaning:str deltas:dict "
               "highlights:dict ~warnings:list[str] ~problems:list[str] ~went_down:list[str] "
               "~engines:list[@share] "
               "~served:dict? ~counted:@counted",
    "status": "run_id:str path:str state:str why:str? delta:dict? ~fresh_by:str?",
    "summary": "run_id:str verdict:str exit_code:int ~requests_ok:count ~requests_total:count "
               "~requests_ran:int ~notes:list[str] ~warnings:list[str] ~settled_s:list ~counters:dict? "
               "~spec_decode:dict? ~contract:bool ~plan_differences:list ~cache_check:str "
               "~parts:list[list] ~shape:@shape ~probe:list ~identifiers_exact:dict ~worst_cer:num? "
               "~worst_typos:int? ~passages_ok:str ~preambles:list[str] "
               "~time_to_warm:@time_to_warm elapsed_s:finite deadline_s:finite problems:list[str] "
               "records:str",
    "probe": "run_id:str item:str round:int index:int engine:int? request_id:str "
             "request_kind:str ttft_s:finite? total_s:finite? " + _ANSWER + " ok:bool problems:list[str]",
    "probe_summary": "run_id:str items:list[@probe_item] ~counters:dict ~status:dict "
                     "meaning:str",
    "gate": "run_id:str request_id:str request_kind:str probe:str kind:str shape:str "
            "index:int engine:int? " + _ANSWER + " exact:bool? edit_distance:int? "
            "reference_chars:int answer_chars:int? cer:finite? word_errors:count? "
            "reference_words:int? preamble_chars:int? removed:list[str] latency_s:finite? "
            "sent_at_s:finite? ok:bool problems:list[str]",
    "gate_summary": "run_id:str verdict:str exit_code:int identifiers_exact:dict[str] "
                    "worst_cer:finite? passages_ok:str? worst_typos:int? max_typos:int "
                    "preambles:list[str] max_cer:num endpoint:str elapsed_s:num? "
                    "problems:list[str] records:str?",
}

# The objects records nest (@name): a run's plan (each mode writes some of its fields), a
# gauge sample, the speculative figures, an engine's share, an operator counter, a probe item.
SHAPES = {
    "plan": "~waves:list[@wave_plan] ~tokens:count ~priority:int ~chunk_tokens:count "
            "~chunk_source:str ~b1_target_tokens:int ~b1_min_prompt_tokens:int "
            "~b1_context_tokens:int? ~b1_one_step:bool ~b1_tokens:int ~file:@plan_file? "
            "~paths:list[@path_plan] ~requests_per_engine:count ~requests_total:count "
            "~completion_tokens_max:int ~gauge_interval_ms:int? ~given:dict[str] "
            "~engines_skipped:list[int] ~contract:bool ~differences:list[str] ~deadline_s:finite "
            "~foreign_work:str ~b1_prompt_tokens_counted:int? "
            "~b1_prompt_tokens_by_engine:dict[int]? ~b1_sizing:str ~items:list[@item_plan] "
            "~rounds:int ~long_tokens:int? ~long_prompt_tokens_counted:int? ~stream:bool "
            "~prompts:str ~socket_cap_s:num ~probes:list[@gate_probe] ~shapes:list[str] "
            "~endpoint:str ~path:str ~max_tokens:count ~max_cer:finite ~max_typos:count "
            "~temperature:num ~seed:int ~chat_template_kwargs:dict?",
    "wave_plan": "wave:str depth:int kind:str",
    "time_to_warm": "start_to_healthy_s:finite? healthy_to_warm_s:finite? "
                    "start_to_warm_s:finite?",
    "plan_file": "name:str sha256:str base64:str",
    "path_plan": "path:str depths:list[int] endpoint:str stream:bool",
    "item_plan": "item:str depth:int",
    "gate_probe": "probe:str kind:str reference_chars:int",
    "sample": "name:str labels:dict[str] value:any",
    "spec": "drafts:num draft_tokens:num? accepted_tokens:num? drafted_length:finite? "
            "acceptance_rate:num? mean_acceptance_length:num? acceptance_by_position:list[num?]",
    "share": "engine:int generation_tokens:num? generation_tokens_planned:int "
             "prompt_tokens:num? b1_prompt_tokens:int?",
    "counted": "counter:str unit:str delta:any sent:num foreign:finite? went_down:bool why:str? "
               "waves:dict overlaps:list[str]",
    "shape": "verdict:str requests_ok:int requests_total:int parts:list[list] "
             "problems:list[str]",
    "probe_item": "item:str engine:int? rounds:int cached_rounds:list[int] "
                  "ttft_first_s:finite? ttft_later_median_s:finite? ttft_ratio:num? "
                  "total_first_s:finite? total_later_median_s:finite? total_ratio:num?",
}


def parse_fields(spec: str) -> dict[str, tuple[str, bool, bool]]:
    """'~name:int?' -> {name: (type, required, nullable)}."""
    fields = {}
    for item in spec.split():
        name, kind = item.split(":")
        fields[name.lstrip("~")] = (kind.rstrip("?"), not name.startswith("~"),
                                    kind.endswith("?"))
    return fields


RECORDS = {kind: parse_fields(spec) for kind, spec in DECLARED.items()}
NESTED = {name: parse_fields(spec) for name, spec in SHAPES.items()}
ANSWER_FIELDS = tuple(parse_fields(_ANSWER))   # what every record of a request keeps of its answer
JUDGED = {"warmup": "request", "probe": "probe", "gate": "gate"}    # mode -> its records
BIGGEST = 1 << 63                     # an int or num field holds a 64-bit integer at most
BASE_TYPES = {"str": str, "int": int, "num": (int, float), "bool": bool, "list": list,
              "dict": dict, "count": int, "finite": (int, float)}


def field_problems(record: dict) -> list[str]:
    """How a record breaks its kind's declaration ([] when it holds): an unknown kind, a
    required field missing, a field not declared, a value of the wrong type (at any depth)."""
    kind = record.get("record")
    fields = RECORDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return [f"a record of unknown kind {str(kind)[:40]!r}"]
    return object_problems({k: v for k, v in record.items() if k != "record"}, fields,
                           f"{kind} record")


def object_problems(value: dict, fields: dict, where: str) -> list[str]:
    """How an object breaks its fields' declaration; `where` names it in each problem."""
    problems = [f"{where} without {name}" for name, (_, required, _) in fields.items()
                if required and name not in value]
    for name, item in value.items():
        if name not in fields:
            problems.append(f"{where} with an undeclared field {str(name)[:40]!r}")
        elif not (item is None and fields[name][2]):
            problems += type_problems(item, fields[name][0], f"{where}'s {name}")
    return problems


def type_problems(value, kind: str, where: str) -> list[str]:
    """How a value is not of a declared type: list[T] and dict[T] hold items of type T
    (T? may be null), @name is an object of SHAPES; int and num are never a bool."""
    if kind.startswith("@"):
        return object_problems(value, NESTED[kind[1:]], where) if isinstance(value, dict) \
            else [f"{where} is not an object"]
    outer, _, inner = kind.partition("[")
    if outer in ("int", "num", "finite") and isinstance(value, int) and \
            not -BIGGEST <= value < BIGGEST:
        return [f"{where} is not {kind} (an integer past 64 bits)"]
    if outer == "count" and isinstance(value, int) and not 0 <= value < 1 << 53 or \
            outer == "finite" and isinstance(value, (int, float)) and not 0 <= value < math.inf:
        return [f"{where} is not {kind}"]
    if kind == "any" or isinstance(value, BASE_TYPES[outer]) and not (
            isinstance(value, bool) and outer in ("int", "num", "count", "finite")):
        if not inner:
            return []
        inner, nullable = inner[:-1].rstrip("?"), inner.endswith("?]")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            shown = key if isinstance(key, int) else repr(str(key)[:40])
            found = [] if item is None and nullable else \
                type_problems(item, inner, f"{where}[{shown}]")
            if found:
                return found[:1]          # the first item that breaks it says it
        return []
    return [f"{where} is not {kind}"]


def held(records: list[dict]) -> tuple[list[Record], list[str]]:
    """The one reader of records from a file: (those that hold their declarations, typed;
    a line for each that does not, which is left out)."""
    kept, problems = [], []
    for record in records:
        found = field_problems(record)
        if found:
            where = f"{label(record)}: " if record.get("record") in JUDGED.values() else ""
            problems.append(f"{where}{'; '.join(found[:3])}: the record is not read")
        else:                             # the server's words: their type and size only
            kept.append(typed(dict(record, stop_reason=clean_stop_reason(
                record["stop_reason"])) if "stop_reason" in record else record))
    return kept, problems


class Record(dict):
    """A record that holds its declaration: the dict it is written as, each declared field
    an attribute (None when absent). One class per kind and nested shape, from DECLARED."""

    __slots__ = ()

    @property
    def record(self) -> str | None:
        """Its kind (the `record` field)."""
        return self.get("record")


def record_class(name: str, fields: dict) -> type:
    """A declared kind's class: a property per field (`items`, a dict method, read by key)."""
    namespace = {"__slots__": (), "FIELDS": fields}
    for field in fields:
        if not hasattr(dict, field):
            namespace[field] = property(lambda self, field=field: self.get(field))
    return type(name.title().replace("_", ""), (Record,), namespace)


CLASSES = {kind: record_class(kind, fields) for kind, fields in RECORDS.items()}
SHAPED = {name: record_class(name, fields) for name, fields in NESTED.items()}


def typed(record: dict) -> Record:
    """A record that holds its declaration as its kind's class, nested objects as theirs."""
    return shaped(record, CLASSES[record["record"]])


def shaped(value: dict, cls: type) -> Record:
    out = cls(value)
    for name, (kind, _, _) in cls.FIELDS.items():
        item = value.get(name)
        inner = kind.removeprefix("list[").rstrip("]?")
        if item is None or not inner.startswith("@"):
            continue
        shape = SHAPED[inner[1:]]
        out[name] = shaped(item, shape) if kind.startswith("@") else \
            [x if x is None else shaped(x, shape) for x in item]
    return out


def clean_stop_reason(value) -> str | None:
    """stop_reason as kept: null, or its type and size only (never a server's text or id)."""
    if value is None or isinstance(value, str) and DESCRIBED.fullmatch(value):
        return value                      # already a description (a records file's)
    if isinstance(value, int) and not isinstance(value, bool):
        return "<a token id>"
    if isinstance(value, str):
        return f"<a string of {len(value)} characters>"
    return f"<{type(value).__name__}>"


def label(record: dict) -> str:
    """How a line names a request: B2#1 (e1 B2#1 with engines), 'single round 1#0'
    (probe), 'alone id_repo#0' (gate)."""
    if record.get("shape"):
        where = f"{show(record.get('shape'))} {show(record.get('probe'))}"
    else:
        where = show(record.get("wave")) if record.get("wave") else \
            f"{show(record.get('item'))} round {show(record.get('round'))}"
    engine = record.get("engine")
    return f"{'' if engine is None else f'e{show(engine)} '}{where}#{show(record.get('index'))}"


# Any value of a record, shown safely.

def show(value, limit: int = SHOW_LIMIT) -> str:
    """Any value from a records file as one clean line: None is '-', never 'None'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        return clean_text(repr(value), limit)
    if not isinstance(value, str):
        value = json.dumps(value, ensure_ascii=False)[:64 * limit]
    return clean_text(value, limit) or "-"


def shown_number(value) -> str:
    """A number as a line says it ('320', not '320.0'); anything else as show() says it."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and \
            math.isfinite(value):
        return f"{value:g}"
    return show(value)


def parts_text(parts) -> str:
    """A verdict's parts as its line says them: 'plan 10/10, paths stream 5/5' (any
    value from a file shown safely)."""
    return ", ".join(f"{show(part[0])} {show(part[1])}/{show(part[2])}"
                     for part in (parts if isinstance(parts, list | tuple) else ())
                     if isinstance(part, list | tuple) and len(part) == 3)


def shape_text(shape: dict) -> str:
    """The --paths shape test's own verdict line, with its problems ('' without one)."""
    if not isinstance(shape, dict):
        return ""
    problems = shape.get("problems") or []
    return (f"shape test, never part of a pass: {show(shape.get('verdict'))}, "
            f"{parts_text(shape.get('parts')) or '-'}"
            + "".join(f"\n  - {show(p, 300)}" for p in problems[:5])
            + (f"\n  - and {len(problems) - 5} more in the records" if len(problems) > 5
               else ""))
