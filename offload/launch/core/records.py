"""The one home of the records: each kind's fields, their types, which are required, and
how a record is named in a line.

Below the run frame (transport <- records <- runframe): plain data and pure functions.
Run.write() holds every record to its declaration (a record that breaks it is a defect,
found by the tests, never written); the report reads through field_problems() and
label(), never through a program. CONTRACT.md's records table lists the same fields (a
test holds the two together). A field written `name:type?` may be null, `~name:type` may be absent.

Types: str, int (never a bool), num (int or float), bool, list, dict, any.
"""

from __future__ import annotations

import json

from core.transport import clean_text, finite_number

SHOW_LIMIT = 80                       # one value in a table or a line

FORMAT = 2                            # the run record's `format`: what this layout is

_ANSWER = ("http_status:int? choices:int? usage:bool body_error:str? prompt_tokens:int? "
           "completion_tokens:int? cached_tokens:int? reasoning_tokens:int? "
           "finish_reason:str? stop_reason:any stream_done:bool? first_token:bool? "
           "logprobs_count:int? usage_problems:list error:str?")

DECLARED = {
    "run": "run_id:str mode:str format:int started_at:str base_url:str "
           "model:str? max_model_len:int? engines:list? plan:dict versions:dict "
           "process_start_time_seconds:num? ~spec_positions:int? api_key_env:str "
           "api_key_set:bool pid:int",
    "gauges": "run_id:str wave:str at_s:num ok:bool samples:list fresh_engines:list "
              "settle_s:num? problems:list ~sleep_state:dict?",
    "request": "run_id:str request_id:str request_kind:str wave:str ~path:str depth:int "
               "index:int engine:int? " + _ANSWER + " latency_s:num? sent_at_s:num? ok:bool "
               "problems:list metrics:dict? speculative_decoding:dict?",
    "wave": "run_id:str wave:str ~path:str depth:int engine:int? release_skew_ms:num? "
            "batch_release_skew_ms:num? duration_s:num started_at_s:num "
            "released_at:str? last_answer_at:str? ok:bool requests_ok:int problems:list "
            "~counters:dict ~counters_cut:int? ~counters_went_down:list ~counters_why:str? "
            "~running_max:num? ~waiting_max:num? ~gauge_samples:int ~gauge_reads:int? "
            "~gauge_reads_failed:int? ~spec_decode:dict? ~tokens_per_step:num?",
    "metrics": "run_id:str source:str state:str why:str? meaning:str deltas:dict "
               "highlights:dict ~warnings:list ~problems:list ~engines:list ~served:dict? "
               "~counted:dict",
    "status": "run_id:str path:str state:str why:str? delta:dict? ~fresh_by:str?",
    "summary": "run_id:str verdict:str exit_code:int ~requests_ok:int ~requests_total:int "
               "~requests_ran:int ~notes:list ~warnings:list ~settled_s:list ~counters:dict? "
               "~spec_decode:dict? ~contract:bool ~plan_differences:list ~cache_check:str "
               "~parts:list ~paths:dict ~probe:list ~identifiers_exact:dict ~worst_cer:num? "
               "~worst_typos:int? ~passages_ok:str ~preambles:list ~time_to_warm:dict "
               "elapsed_s:num "
               "deadline_s:num problems:list records:str",
    "probe": "run_id:str item:str round:int index:int engine:int? request_id:str "
             "request_kind:str ttft_s:num? total_s:num? " + _ANSWER + " ok:bool problems:list",
    "probe_summary": "run_id:str items:list meaning:str",
    "gate": "run_id:str request_id:str request_kind:str probe:str kind:str shape:str "
            "index:int engine:int? " + _ANSWER + " exact:bool? edit_distance:int? "
            "reference_chars:int answer_chars:int? cer:num? word_errors:int? "
            "reference_words:int? preamble_chars:int? removed:list latency_s:num? "
            "sent_at_s:num? ok:bool problems:list",
    "gate_summary": "run_id:str verdict:str exit_code:int identifiers_exact:dict "
                    "worst_cer:num? passages_ok:str? worst_typos:int? max_typos:int "
                    "preambles:list max_cer:num endpoint:str elapsed_s:num? problems:list "
                    "records:str?",
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
ANSWER_FIELDS = tuple(parse_fields(_ANSWER))   # what every record of a request keeps of its answer
JUDGED = {"warmup": "request", "probe": "probe", "gate": "gate"}    # mode -> its records


def has_type(value, kind: str) -> bool:
    if kind == "any":
        return True
    if kind in ("int", "num") and isinstance(value, bool):
        return False
    return isinstance(value, {"str": str, "int": int, "num": (int, float), "bool": bool,
                              "list": list, "dict": dict}[kind])


def field_problems(record: dict) -> list[str]:
    """How a record breaks its kind's declaration ([] when it holds): an unknown kind, a
    required field missing, a field not declared, a value of the wrong type."""
    kind = record.get("record")
    fields = RECORDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        return [f"a record of unknown kind {str(kind)[:40]!r}"]
    problems = [f"{kind} record without {name}" for name, (_, required, _) in fields.items()
                if required and name not in record]
    for name, value in record.items():
        if name == "record":
            continue
        if name not in fields:
            problems.append(f"{kind} record with an undeclared field {str(name)[:40]!r}")
        elif not (value is None and fields[name][2]) and not has_type(value, fields[name][0]):
            problems.append(f"{kind} record's {name} is not {fields[name][0]}")
    return problems


def label(record: dict) -> str:
    """How a line names a request: B2#1 (e1 B2#1 with engines), 'single round 1#0'
    (probe), 'alone id_repo#0' (gate)."""
    if record.get("shape"):
        where = f"{record.get('shape')} {record.get('probe')}"
    else:
        where = record.get("wave") or f"{record.get('item')} round {record.get('round')}"
    engine = record.get("engine")
    return f"{'' if engine is None else f'e{engine} '}{where}#{record.get('index')}"


# ---------------------------------------------------------------------------
# Any value of a record, shown safely.
# ---------------------------------------------------------------------------

def as_dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def as_list(value) -> list:
    """A list field as a list: a lone string becomes one item, anything else nothing."""
    if isinstance(value, list):
        return value
    return [value] if isinstance(value, str) else []


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


def parts_text(parts) -> str:
    """A verdict's parts as its line says them: 'contract 10/10, paths stream 5/5' (any
    value from a file shown safely)."""
    return ", ".join(f"{show(part[0])} {show(part[1])}/{show(part[2])}"
                     for part in (parts if isinstance(parts, list | tuple) else ())
                     if isinstance(part, list | tuple) and len(part) == 3)
