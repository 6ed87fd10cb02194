"""The command line every program shares: exit codes, one line out, number and list
types, a setting from its flag or its variable."""

from __future__ import annotations

import argparse
import decimal
import os
import re
import sys

from core.sanitize import clean_text, sanitize_text
from core.transport import UsageError

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_REFUSED = 3
EXIT_INTERRUPTED = 130              # SIGINT (Ctrl-C): 128 + 2
EXIT_TERMINATED = 143               # SIGTERM: 128 + 15
EXIT_HARD_BOUND = 124               # TERM from warmup_serve.sh's hard bound (timeout's status)
EXIT_HARD_KILLED = 137              # its KILL, or any other KILL: 128 + 9
MAX_SECONDS = 3600.0                 # no wait, deadline or bound is longer than an hour


def outcome(verdict, exit_code) -> str:
    """The one name of how a run ended, for the terminal, start.log and the textfile alike:
    its verdict, but 'usage' for a configuration error (exit 2) whenever it was found."""
    return "usage" if exit_code == 2 and verdict in ("fail", "usage") else str(verdict)


def plug_in(name: str, needs: str = "__name__"):
    """A module loaded with its flag (core.textfile ...); UsageError when the folder lost it
    (or a bad copy cut it short: it does not hold `needs`, what the caller uses)."""
    try:
        module = __import__(name, fromlist=["_"])
        getattr(module, needs)
        return module
    except (ImportError, SyntaxError, AttributeError) as exc:   # gone, or cut short
        lost = exc.name if isinstance(exc, ImportError) and exc.name else name
        raise UsageError(f"cannot load {lost}: offload/launch/ is copied and rolled back as "
                         f"one folder; restore the whole folder") from None


def sanitize_lines(text: str) -> str:
    """The terminal sink's rule: each line of ours through sanitize.sanitize_text."""
    return "\n".join(sanitize_text(line) for line in text.split("\n"))


def printable(text: str, stream) -> str:
    """The text as the stream can encode it (an ASCII terminal gets '?', never an error)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        return text.encode(encoding, "replace").decode(encoding, "replace")


def emit(text: str, stream=None) -> bool:
    """Print from the main thread when no run is in flight (reports, plans); a reader that
    went away (`| head -1`) ends the printing quietly. False when it did."""
    stream = sys.stdout if stream is None else stream
    if stream is None:                  # the descriptor was closed at start (1>&-)
        return False
    try:
        print(printable(sanitize_lines(text), stream), file=stream, flush=True)
        return True
    except (OSError, ValueError):
        silence(stream)
        return False


def silence(stream) -> None:
    """Point a dead stream's descriptor at /dev/null, so the interpreter's exit is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?")   # the house's one grammar of a number


def number_type(convert, fits, wants: str, name: str):
    """An argparse type: convert(text) when it is a NUMBER that `fits`, else '<wants>, got
    <text>'. int() and float() also take '1_000', ' 5', '1e3', 'nan' and other scripts'
    digits, which no option, variable or file of ours means (warmup_serve.sh: the same).
    The range is checked on the exact decimal too: 0.9999999999999999999 is no float 1."""
    def parse(text: str):
        try:
            value = convert(text) if NUMBER.fullmatch(text) else None
        except ValueError:
            value = None
        if value is None or not fits(value) or not fits(decimal.Decimal(text)):
            raise argparse.ArgumentTypeError(f"{wants}, got {text!r}")
        return value
    parse.__name__ = name
    return parse


def number_in(text: str, parse):
    """A number in our own file or line, by an argparse type of NUMBER (None: none)."""
    try:
        return parse(text)
    except argparse.ArgumentTypeError:
        return None


def seconds(high: float = MAX_SECONDS):
    """An argparse type: a number of seconds in (0, high]."""
    return number_type(float, lambda v: 0 < v <= high, f"must be a number of seconds greater "
                       f"than 0 and at most {high:g}", "seconds")


def whole(low: int, high: int):
    """An argparse type: a whole number in [low, high]."""
    return number_type(int, lambda v: low <= v <= high,
                       f"must be a whole number from {low} to {high}", "number")


def comma_list(text: str, item, wants: str) -> tuple:
    """The one reader of a comma list: each part through `item`, each once; ValueError
    saying what it `wants` when a part is not one, or says one twice."""
    try:
        parts = tuple(item(part.strip()) for part in text.split(","))
    except ValueError:
        raise ValueError(f"wants {wants}; got {clean_text(text, 80)!r}") from None
    if len(set(parts)) != len(parts):
        raise ValueError(f"names one twice; got {clean_text(text, 80)!r}")
    return parts


def argument_type(parse):
    """An argparse type over a parser that raises ValueError."""
    def checked(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc))
    checked.__name__ = parse.__name__
    return checked


def given_value(flag, option: str, variable: str, parse, default, env=None) -> tuple:
    """(value, where it came from): the flag's ('--waves on the command line'), else the
    environment variable's (os.environ, or `env`), parsed and named when bad
    ('WARMUP_WAVES=1,2 from the environment'), else (default, None)."""
    if flag is not None:
        return flag, f"{option} on the command line"
    text = (os.environ if env is None else env).get(variable)
    if not text:
        return default, None
    try:
        return parse(text), f"{variable}={clean_text(text, 40)} from the environment"
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise UsageError(f"{variable}: {exc}")


class Setting:
    """One option and the variable that gives its default: what the parser's option, the
    help's list of variables and where a value came from are all made from."""

    def __init__(self, flag: str, variable: str, parse, default, help_text: str, *,
                 shown: str = "", metavar: str = "N", note: str = "", many: bool = False):
        self.flag, self.variable = flag, variable
        self.parse = parse                # text -> value; ValueError when it is not one
        self.default, self.help = default, help_text   # "(default: ...)" is made here
        self.shown = shown                # the default as the help says it (else the value)
        self.metavar = metavar
        self.note = note                  # said beside the variable in the help's list
        self.many = many                  # repeatable; the variable's items split by spaces

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        default = f"${self.variable}, else {self.shown or self.default}"
        parser.add_argument(self.flag, metavar=self.metavar, type=argument_type(self.parse),
                            default=None, action="append" if self.many else "store",
                            help=f"{self.help}{'; repeatable' if self.many else ''} "
                                 f"(default: {default})")

    def listed(self) -> str:
        """Its line in the help's list of variables."""
        note = "; ".join(filter(None, (self.note, "several: separated by spaces"
                                       if self.many else "")))
        return f"  {self.variable:<19} default for {self.flag}" + (f" ({note})" if note else "")

    def value(self, args: argparse.Namespace, env=None) -> tuple:
        """(value, where it came from: the flag, the variable with its value, or None for
        the default); a repeatable one's value is a tuple."""
        given = getattr(args, self.dest)
        if not self.many:
            return given_value(given, self.flag, self.variable, self.parse, self.default, env)
        return given_value(tuple(given) if given else None, self.flag, self.variable,
                           lambda text: tuple(map(self.parse, text.split())), self.default,
                           env)


def add_status_wait_options(parser: argparse.ArgumentParser, when: str) -> None:
    """--status-time-field and --status-wait-s, the warm-up's and the probe's alike."""
    parser.add_argument("--status-time-field", metavar="NAME", default="timestamp",
                        help="the field a status file's writer stamps on each rewrite: a "
                             "snapshot is fresh when it moves (else the file's modification "
                             "time; the status record says which) (default: %(default)s)")
    parser.add_argument("--status-wait-s", metavar="S", type=seconds(), default=15.0,
                        help=f"seconds to wait for each status file's rewrite, {when} (default: 15)")
