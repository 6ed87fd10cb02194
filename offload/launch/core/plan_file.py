"""A plan file: JSON an operator reviews and checks in with a deployment (--plan FILE,
WARMUP_PLAN), bounded and read whole before anything is sent; a run record's copy is
believed only when its text hashes to its SHA-256 (recorded_file()).

{"name": "k1", "waves": [{"depth": 1, "prompt": "long"}, {"depth": 2, "prompt": "short"}],
 "tokens": 32, "priority": 20, "b1_tokens": 5000, "paths": []}
"""

from __future__ import annotations

import hashlib
import json
import re
from base64 import b64decode, b64encode
from collections import namedtuple

from core.files import open_regular
from core.sanitize import clean_text
from core.transport import UsageError


class PlanFile(namedtuple("PlanFile", "name sha256 text fields")):
    """A plan file as read: its name, the SHA-256 of its bytes, its text, and its fields
    as plan_fields() read them (parsed once)."""

    def recorded(self) -> dict:
        """As a run record's plan holds it: the text in base64, which no sink rewrites."""
        return {"name": self.name, "sha256": self.sha256,
                "base64": b64encode(self.text.encode()).decode()}


MAX_PLAN_BYTES = 2048               # its base64 fits the records sink's 4,000 characters
MAX_WAVES, MAX_DEPTH = 16, 64
MAX_REQUESTS = 128                    # per engine: 4,096 completion tokens at most
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FIELDS = {"name", "waves", "tokens", "priority", "b1_tokens", "paths"}
# What every request keeps whatever the plan (the patch note's): a file may only say them.
FIXED = {"tokens": (32, "the patch note's max_tokens = min_tokens"),
         "priority": (20, "the patch note's"),
         "paths": ([], "request kinds are a shape test of their own: --paths")}
# The default plan is known by its digest (plans/patch-note.json), never by its name.
DEFAULT_NAME = "patch-note"
DEFAULT_SHA256 = "b96d11a14cb2b6e8415e518c2a5ea11088db63c63b127caf2254c31acf58ee70"


def read_plan_file(path: str, option: str = "--plan") -> PlanFile:
    """The file at `path`, held to plan_fields(); UsageError naming the option, the file and
    the field."""
    try:
        with open_regular(path) as handle:         # a FIFO or a device could block
            data = handle.read(MAX_PLAN_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{option} {clean_text(path, 200)}: cannot be read "
                         f"({exc.strerror or exc})") from None
    try:
        if len(data) > MAX_PLAN_BYTES:
            raise ValueError(f"larger than {MAX_PLAN_BYTES} bytes")
        text = data.decode("utf-8")
        fields = plan_fields(text)
        digest = hashlib.sha256(data).hexdigest()
        if fields["name"] == DEFAULT_NAME and digest != DEFAULT_SHA256:
            raise ValueError(f"name: '{DEFAULT_NAME}' is the default plan's, known by its "
                             f"digest; give this plan a name of its own")
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option} {clean_text(path, 200)}: {clean_text(str(exc), 300)}; "
                         f"nothing was sent") from None
    return PlanFile(fields["name"], digest, text, fields)


def recorded_file(recorded: dict) -> tuple[PlanFile | None, str]:
    """(the PlanFile a run record's plan holds, ''), or (None, why it cannot be believed):
    its text must hash to its digest and be a plan of its name."""
    try:
        data = b64decode(recorded["base64"], validate=True)
        text = data.decode("utf-8")
        file = PlanFile(recorded["name"], recorded["sha256"], text, plan_fields(text))
    except ValueError as exc:
        return None, f"the run record's plan file is not a plan ({clean_text(str(exc), 120)})"
    if hashlib.sha256(data).hexdigest() != file.sha256:
        return None, "the run record's plan file does not hash to its sha256"
    if file.fields["name"] != file.name:
        return None, "the run record's plan file is not named as its text names it"
    if file.name == DEFAULT_NAME and file.sha256 != DEFAULT_SHA256:
        return None, "the run record's plan file takes the default's name, not its digest"
    return file, ""


def plan_fields(text: str) -> dict:
    """A plan file's text -> {name, waves, tokens, priority, b1_tokens, paths} (waves as
    depths, the first the long-prompt wave); ValueError naming the first field that is
    wrong, missing or unknown."""
    try:
        doc = json.loads(text, parse_constant=reject, object_pairs_hook=unique)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    unknown = sorted(set(doc) - FIELDS)
    missing = sorted(FIELDS - {"paths"} - set(doc))
    if unknown or missing:
        raise ValueError(f"field '{clean_text((unknown or missing)[0], 40)}' "
                         f"{'unknown' if unknown else 'missing'}")
    if not isinstance(doc["name"], str) or not NAME.fullmatch(doc["name"]):
        raise ValueError("name: 1 to 64 letters, digits, '.', '_' or '-'")
    depths = wave_depths(doc["waves"])
    for key, (value, why) in FIXED.items():
        if doc.get(key, value) != value or type(doc.get(key, value)) is not type(value):
            raise ValueError(f"{key}: must be {json.dumps(value)} ({why}); a plan changes only "
                             f"its waves and B1's size")
    if sum(depths) > MAX_REQUESTS:
        raise ValueError(f"waves: at most {MAX_REQUESTS} requests per engine")
    return {"name": doc["name"], "waves": depths, "tokens": 32, "priority": 20,
            "b1_tokens": whole_field(doc, "b1_tokens", 1024, 1 << 20), "paths": ()}


def wave_depths(waves) -> tuple[int, ...]:
    """The waves' depths: distinct, the first the long-prompt wave of depth 1 (B1)."""
    if not isinstance(waves, list) or not 1 <= len(waves) <= MAX_WAVES:
        raise ValueError(f"waves: a list of 1 to {MAX_WAVES} waves")
    depths = []
    for i, wave in enumerate(waves):
        if not isinstance(wave, dict) or set(wave) != {"depth", "prompt"}:
            raise ValueError(f"waves[{i}]: an object with depth and prompt")
        depth = whole_field(wave, "depth", 1, MAX_DEPTH, f"waves[{i}].")
        if wave["prompt"] != ("long" if i == 0 else "short") or (i == 0 and depth != 1):
            raise ValueError(f"waves[{i}].prompt: the first wave is the long prompt, of depth "
                             f"1 (B1); every other is short")
        depths.append(depth)
    if len(set(depths)) != len(depths):
        raise ValueError("waves: each depth once")
    return tuple(depths)


def whole_field(doc: dict, key: str, low: int, high: int, where: str = "") -> int:
    """doc[key], a whole number from low to high (a JSON integer, not a boolean)."""
    value = doc[key]
    if type(value) is not int or not low <= value <= high:
        raise ValueError(f"{where}{key}: a whole number from {low} to {high}")
    return value


def unique(pairs: list) -> dict:
    """A JSON object whose keys are each said once (a reviewer reads the first)."""
    doc = dict(pairs)
    if len(doc) != len(pairs):
        said = [key for key, _ in pairs]
        raise ValueError(f"field '{clean_text(next(k for k in said if said.count(k) > 1), 40)}' "
                         f"twice")
    return doc


def reject(constant: str):
    raise ValueError(f"{constant} is not JSON")
