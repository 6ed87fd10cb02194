"""What a server command says, as start.sh reads it: pure functions of its arguments
(its flags' values, its token counts as vLLM reads them, the address its --port and
--host give, the command as it may be logged with secret flags' values hidden).
"""

from __future__ import annotations

import re

_FLAG = r"--?[a-z0-9_-]*(?:key|token|secret|password)"
_VARIABLE = r"[a-z0-9_]*(?:key|token|secret|password)(?:_[a-z0-9_]*)?="
SECRET_FLAG = re.compile(_FLAG, re.I)
SECRET_VARIABLE = re.compile(_VARIABLE, re.I)     # env HF_TOKEN=..., PGPASSWORD=...
# The same, inside one argument that is a shell's script (bash -c "vllm serve ... --api-key K"):
# a flag's words up to the next flag or the command's end, a variable's one word.
_WORD = r"(?:\"[^\"]*\"|'[^']*'|[^\s;&|]+)"
IN_SCRIPT = re.compile(rf"((?<![\w-]){_FLAG}=){_WORD}|((?<![\w-]){_FLAG}\s+)(?![-;&|]){_WORD}"
                       rf"(?:[ \t]+(?![-;&|]){_WORD})*|((?<![\w-]){_VARIABLE}){_WORD}", re.I)


def redacted_command(command: list[str]) -> str:
    """The command as it may be logged: every value of a secret flag (--api-key, --hf-token,
    --apikey, any flag ending in key, token, secret or password; not
    --max-num-batched-tokens or --ssl-keyfile) hidden, as `--api-key VALUE`, `--api-key
    OLD NEW` (vLLM takes several: every word up to the next flag) and `--api-key=VALUE`,
    a secret given as a variable (`env HF_TOKEN=VALUE`), and both inside a shell's script
    (`bash -c "... --api-key VALUE"`); everything else as given."""
    shown, hide = [], False
    for arg in command:
        name, equals, _ = arg.partition("=")
        flag = arg.startswith("-")
        secret = flag and SECRET_FLAG.fullmatch(name) is not None
        hide = hide and not flag
        script = not (flag or hide) and any(c.isspace() for c in arg)
        variable = not (flag or script) and SECRET_VARIABLE.match(arg) is not None and \
            name.isidentifier()
        if script:
            arg = IN_SCRIPT.sub(lambda m: (m[1] or m[2] or m[3]) + "[redacted]", arg)
        shown.append("[redacted]" if hide else name + "=[redacted]" if (
            secret and equals or variable) else arg)
        hide = hide or secret and not equals
    return " ".join(shown)


def flag_value(flag: str, command: list[str]) -> str:
    """A server flag's value (--port N or --port=N), the last one counting; '' if none."""
    value, take = "", False
    for arg in command:
        if take:
            value, take = arg, False
        if arg.startswith(flag + "="):
            value = arg[len(flag) + 1:]
        elif arg == flag:
            take = True
    return value


def commanded_model(command: list[str]) -> str:
    """The model the server command says it serves: its --served-model-name (the first),
    else its --model, else the argument after `serve` (vllm serve MODEL); '' when none."""
    named = flag_value("--served-model-name", command) or flag_value("--model", command)
    if named:
        return named
    return next((command[i + 1] for i in range(len(command) - 1)
                 if command[i] == "serve" and not command[i + 1].startswith("-")), "")


# vLLM 0.32's human_readable_int: decimal k..t, binary K..T (a decimal only with k..t).
TOKEN_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
                  "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def tokens_value(text: str) -> str:
    """A token count as vLLM reads one (4096, 16K = 16384, 8k = 8000), in digits; '' when
    it is not one (then server.log says the chunk)."""
    found = re.fullmatch(r"([0-9]{1,9})(\.[0-9]{1,6})?([kmgtKMGT]?)", text.strip())
    if not found or (found[2] and found[3] not in ("k", "m", "g", "t")):
        return ""
    return str(int(float(found[1] + (found[2] or "")) * TOKEN_SUFFIXES[found[3]]))


def address_problem(target, command: list[str], given: str = "--base-url") -> str | None:
    """Why the base URL (`given`: the flag or variable that set it) and the server
    command's --port / --host cannot be one address (a mismatch would only show as the
    start guard running out); None when they can be."""
    port, host = flag_value("--port", command), flag_value("--host", command)
    if port and port != str(target.port):
        return (f"{given} {target.display} names port {target.port}, the server command "
                f"--port {port}: make them one address")
    same = {host, target.host} <= {"127.0.0.1", "localhost"} or host == target.host
    if host and host not in ("0.0.0.0", "::", "[::]") and not same:
        return (f"{given} {target.display} names host {target.host}, the server command "
                f"--host {host}: make them one address")
    return None


def command_url(command: list[str]) -> str:
    """The base URL the server command says with its --port and --host (vLLM's defaults:
    8000, every address; a wildcard host is reached on 127.0.0.1)."""
    host = flag_value("--host", command).strip("[]")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
    port = flag_value("--port", command) or "8000"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def seconds_of(text: str) -> float | None:
    """A flag's seconds (vLLM's --shutdown-timeout), or None when not a number."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and 0 <= value < 1e9 else None
