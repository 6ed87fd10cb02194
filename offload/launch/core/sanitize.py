"""What may leave the helper: the sanitizing rules (secrets and our prompt text out, control
characters out), applied once at the sinks (records, terminal: the run frame), and a
server's value read as a count or a finite number, never trusted as one."""

from __future__ import annotations

import math
import re
import threading

SINK_TEXT_LIMIT = 4000               # no string reaches a record or the terminal longer
MODEL_CHARS = 200                    # a model's name as a run record keeps it (ready compares)


class Redactions:
    """What no output may hold, registered as the process learns it: secrets (the API
    key, URL credentials), our prompts' nonces and tags, and our prompts' text. Lookups
    stay cheap however many prompts were registered: tags and word runs are sets."""

    PROMPT_RUN = 4                   # this many words in a row of one of our prompts

    def __init__(self):
        self.lock = threading.Lock()
        self.secrets: tuple[str, ...] = ()    # exact strings, longest first
        self.tags: set = set()                # nonces and tags (matched as whole tokens)
        self.words: set = set()
        self.runs: set = set()

    def secret(self, text: str | None) -> None:
        """Register a secret (a key, credentials): replaced by [redacted] wherever it, or a
        run of its first SECRET_PREFIX characters or more, appears."""
        if text and text not in self.secrets:
            with self.lock:
                # Longest first: a secret inside another is replaced as part of it.
                self.secrets = tuple(sorted(set(self.secrets) | {text}, key=len, reverse=True))

    def tag(self, text: str | None) -> None:
        """Register a nonce or a prompt's tag: replaced where it stands as a whole token."""
        if text and _HEX_TAG.fullmatch(text):
            self.tags.add(text)

    def prompt(self, text: str, tag: bool = True) -> None:
        """Register a prompt we send: its first word (nonce or tag) as a secret, its words
        and every run of PROMPT_RUN words, so an echo of it is found in any output."""
        words = [w.lower() for w in _WORD.findall(text)]
        if tag and words:
            self.tag(text.split(None, 1)[0])
        n = self.PROMPT_RUN
        with self.lock:
            self.words.update(words)
            self.runs.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))

    def reset(self) -> None:
        with self.lock:
            self.secrets, self.tags, self.words, self.runs = (), set(), set(), set()


REDACTIONS = Redactions()
_WORD = re.compile(r"\w+(?:[-.:/+]\w+)*")
# What may move the cursor, start a line or hide text: controls, separators, bidi, tags.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u2028\u2029\u200b-\u200f\u202a-\u202e"
                      r"\u2066-\u2069\ufeff\ud800-\udfff\U000e0000-\U000e007f]+")
_HEX_TAG = re.compile(r"(?:warmup-)?[0-9a-f]{12,}")


SECRET_PREFIX = 8                    # this much of a secret in a row is the secret
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060-\u2064\ufeff\u00ad]")


def redact_secrets(text: str) -> str:
    """Every registered secret, nonce and tag replaced, before anything cuts or quotes the
    text (a cut could keep half a key; repr() would double its backslashes). Invisible
    characters are dropped first (they could split a key); a secret of SECRET_PREFIX
    characters or more is found from its first SECRET_PREFIX on, however much of it
    follows; a shorter one only where it stands as a whole word."""
    if REDACTIONS.secrets:
        text = _INVISIBLE.sub("", text)
    for secret in REDACTIONS.secrets:
        if len(secret) < SECRET_PREFIX:
            text = re.sub(rf"(?<![\w-]){re.escape(secret)}(?![\w-])", "[redacted]", text)
            continue
        low = secret.lower()               # a hex key may come back in capitals
        at = text.lower().find(low[:SECRET_PREFIX])
        while at >= 0:
            end = at + SECRET_PREFIX
            while end < len(text) and end - at < len(low) and text[end].lower() == low[end - at]:
                end += 1
            text = text[:at] + "[redacted]" + text[end:]
            at = text.lower().find(low[:SECRET_PREFIX], at + len("[redacted]"))
    if REDACTIONS.tags:
        text = _HEX_TAG.sub(lambda m: "[redacted]" if m.group() in REDACTIONS.tags
                            else m.group(), text)
    return text


def remove_prompt_runs(text: str, min_run: int = Redactions.PROMPT_RUN) -> str:
    """Runs of words that stand in one of our prompts become [prompt text].

    With min_run = PROMPT_RUN a run must repeat our prompt word for word; shorter
    (a server's validation message, which echoes the request) any run of our prompt
    words counts, and so does anything that looks like a nonce or tag.
    """
    words = list(_WORD.finditer(text))
    if len(words) < min(min_run, 3) or not REDACTIONS.words:
        return text
    lowered = [m.group().lower() for m in words]
    marked = [False] * len(words)
    if min_run >= Redactions.PROMPT_RUN:
        n, runs = Redactions.PROMPT_RUN, REDACTIONS.runs
        for i in range(len(words) - n + 1):
            if tuple(lowered[i:i + n]) in runs:
                marked[i:i + n] = [True] * n
    else:
        vocabulary, i = REDACTIONS.words, 0
        while i < len(words):
            j = i
            while j < len(words) and (lowered[j] in vocabulary or _HEX_TAG.fullmatch(lowered[j])):
                j += 1
            if j - i >= min_run or any(_HEX_TAG.fullmatch(w) for w in lowered[i:j]):
                marked[i:j] = [True] * (j - i)
            i = max(j, i + 1)
    spans, start = [], None
    for i, hit in enumerate(marked + [False]):
        if hit and start is None:
            start = i
        elif not hit and start is not None:
            spans.append((words[start].start(), words[i - 1].end()))
            start = None
    for start, end in reversed(spans):
        text = text[:start] + "[prompt text]" + text[end:]
    return text


def clean_text(text: str, limit: int) -> str:
    """One line, no control characters or lone surrogates, secrets replaced, at most
    `limit` characters: for a cut whose length carries meaning."""
    text = redact_secrets(text)
    if len(text) > 64 * limit:
        text = text[:64 * limit]
    text = " ".join(_CONTROL.sub(" ", text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def scrub(text: str, limit: int) -> str:
    """A server's message made safe to show: our prompts' words and tags removed (any run
    of three of them: validation errors echo the request), then cleaned and cut."""
    return clean_text(remove_prompt_runs(redact_secrets(text)[:64 * limit], 3), limit)


def sanitize_text(text: str, limit: int = SINK_TEXT_LIMIT) -> str:
    """The sink rule for one string: secrets and our prompt text out, control characters
    out (each run becomes one space; other spacing kept), at most `limit` characters."""
    text = redact_secrets(text)[:4 * limit]
    text = remove_prompt_runs(_CONTROL.sub(" ", text))
    return text if len(text) <= limit else text[:limit - 1] + "…"


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def sanitize(value, depth: int = 0):
    """The sink rule for a record: every string in it through sanitize_text; keys too,
    except a plain field name (ours), which a short secret must never rename."""
    if isinstance(value, str):
        return sanitize_text(value)
    if isinstance(value, dict):
        return {k if isinstance(k, str) and _FIELD_NAME.fullmatch(k)
                else sanitize_text(str(k), 200): sanitize(v, depth + 1)
                for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v, depth + 1) for v in value]
    return value


def exact_str(value, limit: int) -> str | None:
    """A server's short string kept exact when it is clean; otherwise its quoted form, so a
    'length\\n' can never be judged as 'length'."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"<{type(value).__name__}>"   # a container may hold text: never quoted
    if value == clean_text(value, limit):
        return value
    return clean_text(repr(redact_secrets(value)), limit)


def describe(value) -> str:
    """What a value that should have been a number is, never the value itself (a string
    from a server may hold anything): its type, and a string's length."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        return "a number that is not a count" if math.isfinite(value) else "a non-finite number"
    if isinstance(value, int):
        return "an integer out of range"
    return f"a JSON {type(value).__name__.replace('dict', 'object').replace('list', 'array')}"


def json_number(value: float):
    """Prometheus values as JSON: NaN and infinities become strings, as Prometheus spells them."""
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")


def count_value(value) -> int | None:
    """A count as the server gave it (a non-negative integer); anything else is None, never 0."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 53:
        return value
    return None


def finite_number(value) -> float | int | None:
    """A finite number as the server gave it; anything else (bool, NaN, text, an integer
    no float can hold) is None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        return value if abs(value) < 1 << 1000 else None
    return value if math.isfinite(value) else None
