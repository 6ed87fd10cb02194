"""start.sh's settings: flags over START_* variables, every one checked before anything is
launched (Settings.check() raises Usage naming the first bad one), and start.sh --help.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import socket

from core.cli import Setting, given_value, number_type, plug_in, seconds, whole
from core.files import regular
from core.transport import DEFAULT_BASE_URL, UsageError, parse_base_url
from start.server_command import (address_problem, command_url, flag_value, seconds_of,
                                  tokens_value)

DESCRIPTION = """\
Start the server in the background (own process group, output to LOG_DIR/server.log),
wait for GET /health = 200 within the start guard, run the warm-up
(offload/launch/warmup_serve.sh), optionally the quality gate, and report OK or WARN.
The server keeps running. start.sh refuses to start when something already answers at
the base URL: it reports only on a server it launched and still sees running (the
launched process itself: a server that forks and exits has ended)."""

EPILOG = """\
START_POLL_S (1), START_SAY_S (30: a "waiting" line while /health is not yet 200)
and START_STOP_GRACE_S (10: TERM, then KILL) tune the waits. WARMUP_* variables reach
the warm-up and the gate unchanged (a WARN names one that made a custom plan), except
two that start.sh sets: WARMUP_BASE_URL (to the base URL) and WARMUP_CHUNK_TOKENS (from
the command's --max-num-batched-tokens, else server.log's start line; start.log says so).

Read the records before releasing HOLD, after OK as after WARN.

exit status:
  0    server up: warm-up (and gate) passed, failed with a WARN, or skipped; with
       --rewarm: it passed
  N    with --supervise, once the server ended: its status when TERM, INT or HUP asked it
       to stop; unasked, its status, 1 for an exit 0 nobody asked for
  1    server not started or not trustworthy: something already answered at the base
       URL, a live server.pid or another start in LOG_DIR, the server exited (also
       during the warm-up), or it missed the start guard (its process group is
       stopped), /proc cannot tell who holds its port, or it serves another model;
       with --rewarm: no live server in LOG_DIR, or the re-warm did not pass (the
       server keeps running)
  2    usage error (bad option, --log-dir not writable, --ready-file folder missing,
       --rewarm without server.pid in LOG_DIR); nothing was launched
  129  interrupted by HUP, as by TERM
  130  interrupted by INT (the server was stopped; with --rewarm, only the warm-up)
  143  interrupted by TERM (the server was stopped; with --rewarm, only the warm-up:
       under --supervise, the owner's re-warm goes on)"""


def switch_name(flag: str) -> str:
    """The setting a switch sets: --no-warmup sets warmup, --require-chunk require_chunk."""
    return flag.removeprefix("--no-").lstrip("-").replace("-", "_")


def switch(text: str) -> bool:
    """A START_* switch variable: 0 or 1."""
    if text not in ("0", "1"):
        raise ValueError(f"must be 0 or 1, got {text!r}")
    return text == "1"


def sha256_hex(text: str) -> str:
    """--plan-sha256: readyfile.sha256_type, loaded with the value."""
    from argparse import ArgumentTypeError
    from core.readyfile import sha256_type
    try:
        return sha256_type(text)
    except ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


# start.sh's settings: the parser's options, their variables and the help are made from
# these rows (core.cli.Setting, as the warm-up's); a switch's variable is 0 or 1.
OPTIONS = (
    Setting("--base-url", "START_BASE_URL", str, DEFAULT_BASE_URL,
            "where the server answers, passed to the warm-up and the gate as is (as "
            "WARMUP_BASE_URL, out of their command lines); user:pass@ in it is never shown, "
            "and sent (as Basic auth) only by the /health and ready checks; one that "
            "differs from the server command's --port and --host is a usage error",
            metavar="URL", shown="from the server command's --port and --host, else "
                               "http://127.0.0.1:8000"),
    Setting("--start-guard-s", "START_GUARD_S", whole(1, 9999999), 600,
            "seconds from launch for /health to answer 200"),
    Setting("--log-dir", "START_LOG_DIR", str, "./logs",
            "server.log, start.log, server.pid, start.lock (one start at a time), records",
            metavar="DIR"),
    Setting("--ready-file", "START_READY_FILE", str, "",
            "written only when the warm-up (and with --gate, the gate) passed the "
            "contract's plan, or the plan file WARMUP_PLAN names (pin its digest: qualify.py "
            "ready --plan-sha256); removed when a start launches. It names the server it "
            "vouches for (its process start, model): `qualify.py ready --ready-file PATH` "
            "says whether it is still true (a readiness probe); its folder must exist",
            metavar="PATH", shown="none"),
    Setting("--plan-sha256", "START_PLAN_SHA256", sha256_hex, "",
            "the ready file (and --supervise's Ready) only for a pass of the plan of this "
            "SHA-256 (sha256sum FILE; the default plan's is "
            "offload/launch/plans/patch-note.json's)", metavar="HEX", shown="any"),
    Setting("--textfile", "START_TEXTFILE", str, "",
            "the warm-up and the gate also publish their result there for monitoring "
            "(node_exporter's textfile collector, *.prom), as WARMUP_TEXTFILE; every start "
            "rewrites it, a server that never became healthy too (success 0)",
            metavar="PATH", shown="$WARMUP_TEXTFILE"),
    Setting("--gate-hard-s", "START_GATE_HARD_S", seconds(86400), 180,
            "hard bound on the gate: TERM at N s, KILL 5 s later"),
    Setting("--keep", "START_KEEP", whole(0, 99999), 10,
            "keep the records of the last N warm-ups (and gates) in the log folder, "
            "removing older ones, each named in start.log; 0 keeps every one"),
    Setting("--ready-port", "START_READY_PORT", whole(0, 65535), 0,
            "with --supervise: answer GET /ready on port N of every address, 200 only while "
            "the warm-up (and gate) passed for the launched process, awake, not stopping; "
            "503 naming the state otherwise (the pod's readiness probe, an httpGet); 0: none. "
            "A port held, or the server's own, is refused before the launch"),
)
SWITCHES = (                               # (flag, variable, the value the flag gives, help)
    ("--require-chunk", "START_REQUIRE_CHUNK", True,
     "no ready file (nor Ready) for a pass that assumed the server's prefill chunk: pin "
     "--max-num-batched-tokens in the command"),
    ("--no-warmup", "START_WARMUP", False, "start and guard only (not with --supervise)"),
    ("--gate", "START_GATE", True, "after a passing warm-up, run `qualify.py gate`"),
    ("--supervise", "START_SUPERVISE", True,
     "a container's entry point: stay the server's parent, its output also on start.sh's "
     "own ('server| ' before each line; each step's records too, 'records| ': the container "
     "log keeps them when the pod is gone) and server.log rotated at START_LOG_MAX_BYTES "
     "(100 MiB; one old copy, server.log.1); pass TERM and INT on to the server process "
     "(HUP as TERM; it drains, then stops its engines). It owns readiness: it alone writes "
     "the ready file and the textfile's outcome, retries a warm-up the guard refused "
     "(backoff 2 s doubling to 30 s, within the start guard), takes readiness away on a "
     "sleep or another process on the port and warms again after the wake, runs --rewarm "
     "when asked (LOG_DIR/owner.sock), and says at a stop whether requests in flight were "
     "cut (WARN at launch without --shutdown-timeout). When the server ends, stop what is "
     "left of its group (KILL after START_STOP_GRACE_S) and exit: with its status when "
     "TERM, INT or HUP asked it to stop, else non-zero (a crash, or an exit 0 nobody asked "
     "for). Without it, server.log grows with the server's output: rotate it with "
     "copytruncate (logrotate), as start.sh keeps appending"),
)
REWARM_HELP = (
    "no start: warm again the server an earlier start.sh launched in LOG_DIR: under "
    "--supervise its owner runs it (its lines shown here); else here (server.pid must be "
    "alive and hold the port server.url names; the chunk from server.chunk when it names "
    "that server), the ready file removed first and written only if it passes, the "
    "textfile as a start's; exit 0 only when it passed (a pod whose warm-up failed: "
    "kubectl exec POD -c vllm -- /opt/offload/start.sh --rewarm)")
TUNING = (                                 # variables only: (variable, parse, default)
    ("START_POLL_S", number_type(float, lambda v: 0.01 <= v <= 60,
                                 "must be a number of seconds from 0.01 to 60", "seconds"), 1.0),
    ("START_SAY_S", whole(1, 999999), 30),
    ("START_STOP_GRACE_S", whole(0, 99999), 10),
    ("START_LOG_MAX_BYTES", whole(1, 10 ** 12 - 1), 100 * 1024 * 1024),
)


class Usage(Exception):
    """A usage error: nothing has been launched (exit 2)."""


class Parser(argparse.ArgumentParser):
    """argparse's wording for a bad flag, raised as Usage (start.sh publishes it first)."""

    def error(self, message: str):
        hint = " (the server command goes after --)" if "unrecognized" in message else ""
        raise Usage(message + hint)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="start.sh", allow_abbrev=False, description=DESCRIPTION, add_help=False,
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                    usage="start.sh [options] -- <server command and its arguments>")
    for setting in OPTIONS:
        setting.add_to(parser)
    for flag, variable, given, help_text in SWITCHES:
        parser.add_argument(flag, action="store_const", const=given, default=None,
                            help=f"{help_text} (or {variable}={int(given)})")
    parser.add_argument("--rewarm", action="store_true", help=REWARM_HELP)
    parser.add_argument("-h", "--help", action="store_true", help="this text")
    return parser


class Settings:
    """start.sh's settings, typed as parsed; the server command after --."""

    def __init__(self, argv: list[str], env: dict):
        self.env = env
        self.source = {}                  # where each value came from: a flag or a variable
        self.command: list[str] = []
        self.help = self.rewarm = False   # --rewarm: warm the server LOG_DIR names again
        self.problem = ""                 # a bad command line or variable, raised by check()
        for setting in OPTIONS:
            setattr(self, setting.dest, setting.default)
            self.source[setting.dest] = setting.variable
        for flag, variable, given, _ in SWITCHES:
            setattr(self, switch_name(flag), not given)
        for variable, _, default in TUNING:
            setattr(self, variable[6:].lower(), default)
        self.textfile = env.get("START_TEXTFILE") or env.get("WARMUP_TEXTFILE", "")
        if not env.get("START_TEXTFILE") and self.textfile:   # the helpers' own variable
            self.source["textfile"] = "WARMUP_TEXTFILE"
        head = argv[:argv.index("--")] if "--" in argv else argv
        self.command = argv[len(head) + 1:]
        try:
            args = build_parser().parse_args(head)
            self.help = args.help
            self.read(args, env)
        except Usage as exc:              # where a usage error is published still counts
            self.problem = str(exc)
            self.textfile = textfile_given(argv, self.textfile)

    def read(self, args: argparse.Namespace, env: dict) -> None:
        """Each value from its flag, else its variable, else its default; Usage naming a
        variable that is not one (core.cli.given_value's wording)."""
        try:
            for setting in OPTIONS:
                value, where = setting.value(args, env)
                if where is not None:
                    setattr(self, setting.dest, value)
                    self.source[setting.dest] = setting.flag if where.startswith("--") \
                        else setting.variable
            for flag, variable, given, _ in SWITCHES:
                value = getattr(args, flag.lstrip("-").replace("-", "_"))   # argparse's dest
                setattr(self, switch_name(flag), value if value is not None else given_value(
                    None, flag, variable, switch, not given, env)[0])
            for variable, parse, default in TUNING:
                setattr(self, variable[6:].lower(),
                        given_value(None, "", variable, parse, default, env)[0])
        except UsageError as exc:
            raise Usage(str(exc)) from None
        self.rewarm = args.rewarm

    def check(self) -> None:
        """Every value checked together, the folders tried; Usage naming the first bad one."""
        if self.problem:
            raise Usage(self.problem)
        if self.rewarm:
            check_rewarm(self)
        elif not self.command:
            raise Usage("no server command: start.sh [options] -- vllm serve MODEL ...")
        check_readiness(self)
        if self.source["base_url"] == "START_BASE_URL" and "START_BASE_URL" not in self.env:
            self.base_url = command_url(self.command)     # the port, said once
            self.source["base_url"] = "the server command's --port and --host"
        if not re.match(r"https?://", self.base_url):
            raise Usage(f"{self.source['base_url']} must start with http:// or https://")
        check_log_dir(self)
        if self.ready_file:
            check_ready_place(self.source["ready_file"], self.ready_file)
        if self.textfile:
            check_file_place(self.source["textfile"], self.textfile)
        try:
            self.target = parse_base_url(self.base_url.rstrip("/"), self.source["base_url"])
        except UsageError as exc:
            raise Usage(str(exc)) from None
        why = address_problem(self.target, self.command, self.source["base_url"])
        if why:
            raise Usage(why)

    def required(self) -> tuple:
        """What a pass must vouch for before the ready file is written (readyfile.unmet)."""
        return self.plan_sha256 or None, self.require_chunk

    def command_shutdown_s(self) -> float | None:
        """The server command's --shutdown-timeout in seconds (None: none, or unreadable)."""
        return seconds_of(flag_value("--shutdown-timeout", self.command))

    def command_chunk(self) -> str:
        """The prefill chunk the server command gives (its last --max-num-batched-tokens,
        read as vLLM reads it), in digits; '' when it gives none that can be read."""
        return tokens_value(flag_value("--max-num-batched-tokens", self.command))

    def server_env(self) -> dict:
        """What the warm-up and the gate get: WARMUP_* unchanged but WARMUP_READY_FILE (the
        launcher writes the ready file, after the gate too), the base URL (out of any
        command line: ps shows those), the textfile, the chunk from the command."""
        env = dict(self.env, WARMUP_BASE_URL=self.base_url)
        env.pop("WARMUP_READY_FILE", None)
        if self.textfile:
            env["WARMUP_TEXTFILE"] = self.textfile
        chunk = self.command_chunk()
        if chunk:
            env["WARMUP_CHUNK_TOKENS"] = chunk    # B1 must be longer than the server's chunk
        return env


def check_readiness(settings: Settings) -> None:
    """Usage unless START_READY_PORT is given only with --supervise (or --rewarm, which
    shares the pod's variables), and --supervise warms up; with the port, the module that
    answers it is loaded now."""
    if settings.supervise and not settings.warmup and not settings.rewarm:
        raise Usage("--no-warmup (START_WARMUP) with --supervise (START_SUPERVISE): its owner "
                    "makes the pod Ready only after a warm-up's pass; drop one of them")
    if settings.ready_port and not (settings.supervise or settings.rewarm):
        raise Usage(f"{settings.source['ready_port']} must be a port from 1 to 65535, and "
                    f"only with --supervise (its owner answers it), got "
                    f"'{settings.ready_port}'")
    if settings.ready_port and settings.supervise:
        try:
            plug_in("start.readiness", needs="serve_readiness")
        except UsageError as exc:
            raise Usage(str(exc)) from None


def ready_port_problem(settings: Settings) -> str:
    """Why the owner could not answer GET /ready on its port ('' if it could): asked once
    the start holds its folder (a start already supervised there is said so first), as
    the owner opens the port only after /health, minutes on."""
    port, source = settings.ready_port, settings.source["ready_port"]
    if not (port and settings.supervise):
        return ""
    if port == settings.target.port:
        return (f"{source} {port} is the server's own port ({settings.target.display}): the "
                f"owner answers GET /ready on another; choose another port")
    with socket.socket() as trial:                   # as the owner's http.server binds it
        trial.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            trial.bind(("", port))
        except OSError as exc:
            why = {errno.EADDRINUSE: "another program listens on it; choose another port",
                   errno.EACCES: "a port below 1024 needs root or CAP_NET_BIND_SERVICE; "
                                 "choose a higher one"}.get(exc.errno, "choose another port")
            return f"{source} {port} cannot be listened on ({os_reason(exc)}): {why}"
    return ""


def check_log_dir(settings: Settings) -> None:
    """Usage unless the log folder can be made, holds no link or FIFO where start.sh
    writes, and start.log and server.log can be written."""
    try:
        os.makedirs(settings.log_dir, exist_ok=True)
    except OSError as exc:
        raise Usage(f"cannot create {settings.source['log_dir']} '{settings.log_dir}' "
                    f"({os_reason(exc)}); choose a writable folder") from None
    for name in ("start.log", "server.log", "server.pid", "server.url", "server.chunk"):
        path = os.path.join(settings.log_dir, name)
        if regular(path) is False:
            raise Usage(f"{settings.source['log_dir']} '{settings.log_dir}': {name} is not a "
                        f"regular file (a link, FIFO or device: start.sh never writes "
                        f"through one); remove it or choose another folder")
    try:
        with open(os.path.join(settings.log_dir, "start.log"), "a"):
            pass
    except OSError as exc:
        raise Usage(f"cannot write start.log in {settings.source['log_dir']} "
                    f"'{settings.log_dir}' ({os_reason(exc)}); choose a writable "
                    f"folder") from None
    server_log = os.path.join(settings.log_dir, "server.log")
    if os.path.exists(server_log) and not os.access(server_log, os.W_OK):
        raise Usage(f"cannot write server.log in {settings.source['log_dir']} "
                    f"'{settings.log_dir}'; choose a writable folder")


def check_ready_place(option: str, path: str) -> None:
    """Usage unless the ready file's folder exists and can be written, and nothing but a
    regular file is at the path."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise Usage(f"{option} '{path}': folder '{folder}' does not exist; create it "
                    f"first")
    if os.path.isdir(path):
        raise Usage(f"{option} '{path}' is a folder")
    check_file_place(option, path)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise Usage(f"{option} '{path}': cannot write in folder '{folder}'")


def check_rewarm(settings: Settings) -> None:
    """Usage when --rewarm comes with what only a start takes."""
    for given, what in ((settings.command, "a server command"),
                        (settings.supervise, "--supervise"),
                        (not settings.warmup, "--no-warmup")):
        if given:
            raise Usage(f"--rewarm takes no {what}: it warms the server LOG_DIR/server.pid "
                        f"names again, as it runs")
    if not os.path.isfile(os.path.join(settings.log_dir, "server.pid")):
        raise Usage(f"--rewarm: no server.pid in {settings.source['log_dir']} "
                    f"'{settings.log_dir}': give the log folder of the start that launched "
                    f"the server (--log-dir or START_LOG_DIR), with its --ready-file and "
                    f"--textfile")


def textfile_given(argv: list[str], default: str) -> str:
    """--textfile's value in a command line that could not be parsed, else default."""
    head = argv[:argv.index("--")] if "--" in argv else argv
    given = [head[i + 1] for i in range(len(head) - 1) if head[i] == "--textfile"] + \
        [arg.partition("=")[2] for arg in head if arg.startswith("--textfile=")]
    return given[-1] if given else default


def os_reason(exc: OSError) -> str:
    """Why a file could not be written, in words an operator acts on."""
    said = {errno.ENOSPC: "no space left on the device", errno.EROFS: "read-only file system"}
    return said.get(exc.errno, exc.strerror or str(exc))


def os_problem(exc: OSError) -> str:
    """An OSError as one line naming its file: 'cannot write PATH: no space left ...'."""
    return f"cannot write {exc.filename}: {os_reason(exc)}" if exc.filename else \
        f"{type(exc).__name__}: {os_reason(exc)}"


def check_file_place(option: str, path: str) -> None:
    """Usage when a file start.sh writes or removes has no folder, or something other
    than a regular file (a device, FIFO or link) is there."""
    if not os.path.isdir(os.path.dirname(path) or "."):
        raise Usage(f"{option} '{path}': its folder does not exist; create it first")
    if regular(path) is False:
        raise Usage(f"{option} '{path}' is not a regular file (a device, FIFO or link)")
