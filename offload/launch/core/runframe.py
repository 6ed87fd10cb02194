"""A run with exactly one summary: settings, clock, records, terminal, signals, exit code.

It knows nothing of vLLM or of waves. A program plugs in through `Program`: its steps, its
run record's fields, its judge, its summary's fields. run_session() runs it and writes one
summary; Run.write() and LineWriter.say() are the two sinks, where sanitize.sanitize
applies, once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import signal
import sys
import threading
import time

from core.values import Value
from core.records import FORMAT, field_problems, parts_text, shape_text
from core.files import open_own, writable
from core.cli import (EXIT_FAIL, EXIT_HARD_BOUND, EXIT_PASS, EXIT_REFUSED, EXIT_USAGE, emit,
                      outcome, plug_in, printable, sanitize_lines, seconds, silence)
from core.sanitize import clean_text, sanitize, sanitize_text
from core.transport import CAUGHT_SIGNALS, Clock, UsageError, start_quiet

PROBLEM_LIMIT = 300                  # one problem string, cut


class Fatal(Exception):
    """A problem that ends the run before (or between) its batches, with its exit code."""

    def __init__(self, problem: str, exit_code: int = EXIT_FAIL):
        super().__init__(problem)
        self.problem = problem
        self.exit_code = exit_code


class RecordsError(Exception):
    """The records file cannot be written: the run cannot leave evidence, so it stops."""


class Terminated(BaseException):
    """Raised in the main thread by the handler of a terminating signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class RunSettings(Value):
    """What every run has, fixed from the command line: who it is, where it writes, its
    bounds."""
    prog: str
    run_id: str
    records_path: str
    deadline_s: float
    socket_cap_s: float
    json: bool = False
    debug: bool = False
    textfile: str | None = None           # publish the result there (Prometheus text)
    append: bool = False                  # records after an earlier run's in the same file


class Ending(Value):
    """How a run's steps ended, as only the run knows it: ran to their end ('pass'), or
    stopped ('fail', 'refused', 'killed') with an exit code; and the problems no record
    shows (a deadline passed, a connection lost, a guard's refusal, a signal)."""
    verdict: str = "pass"
    exit_code: int = EXIT_PASS
    problems: tuple = ()


class Program:
    """What a program plugs into the run frame; override what it needs."""

    mode = "run"                          # the run record's mode

    def steps(self, run: Run) -> None:
        """Everything the program does; Fatal ends it early with a summary."""
        raise NotImplementedError

    def run_fields(self, run: Run) -> dict:
        """The run record's fields beside record, run_id, mode, started_at and pid."""
        return {}

    def judge(self, run: Run, ending: Ending) -> tuple[str, int, list[str]]:
        """The verdict, exit code and problems of the run, however its steps ended."""
        raise NotImplementedError

    def summary_fields(self, run: Run) -> dict:
        """What the summary adds to verdict, exit code, times and problems."""
        return {}

    def after_summary(self, run: Run, summary: dict) -> dict | None:
        """A record written right after the summary (printed instead of it with --json)."""
        return None

    def close(self) -> None:
        """Let go of what the run held (a lock), once its summary is written."""

    def exported(self, run: Run, summary: dict) -> list[tuple]:
        """More samples for the textfile beside every run's own: (name, labels, value,
        help), names in the offload_<mode>_ namespace, labels from our own vocabulary."""
        return []


def late_problem(run: Run) -> list[str]:
    """['finished after the deadline (...)'] when the run is past its deadline, else []."""
    elapsed = run.clock.elapsed()
    if elapsed <= run.settings.deadline_s:
        return []
    return [f"finished after the deadline ({elapsed:.2f} s > {run.settings.deadline_s:g} s)"]


class Run(Value):
    """One run: its settings, its program, its clock and its two sinks."""
    FROZEN = False
    settings: RunSettings
    program: Program
    clock: Clock
    sink: object                          # the records file, opened for appending
    say: object                           # one human line -> the terminal (never blocks)
    started_at: str = ""                  # UTC, to the millisecond: when the run began
    current: str | None = None            # the batch in flight, named if the run is killed
    run_record: dict | None = None        # the run record, once written
    final_record: dict | None = None      # what --json prints
    written: list                         # every record this run wrote, in order
    FRESH = {"written": list}

    def write(self, record: dict) -> dict:
        """Append one record, sanitized here (the records sink) whatever its origin;
        returns the record as written."""
        record = sanitize(record)
        shape = field_problems(record)
        if shape:                            # a defect of ours: never a record off its kind
            raise RecordsError(f"a record off its declaration in records.py (a defect): "
                               f"{'; '.join(shape)}")
        try:
            append_record(self.sink, record)
        except (OSError, ValueError) as exc:
            raise RecordsError(f"cannot write records to {self.settings.records_path}: "
                               f"{getattr(exc, 'strerror', None) or exc}")
        self.written.append(record)
        return record

    def wall(self, at_s: float | None) -> str | None:
        """A moment of the run's clock (seconds from its start) as UTC to the millisecond."""
        if at_s is None:
            return None
        return utc_ms(time.time() - (self.clock.elapsed() - at_s))

    def write_run_record(self) -> None:
        """The run record, once: what ran, against what (never prompt text or the key)."""
        if self.run_record is None:
            self.run_record = self.write({
                "record": "run", "run_id": self.settings.run_id, "mode": self.program.mode,
                "format": FORMAT, "started_at": self.started_at,
                **self.program.run_fields(self), "pid": os.getpid()})


def run_session(settings: RunSettings, program: Program) -> int:
    """The program's steps under the signal handlers, then one summary whatever happened
    (a defect: 'fail', its reason in one line); the exit code."""
    path = settings.records_path
    why = settings.textfile and (
        "it is the records file" if os.path.abspath(settings.textfile) ==
        os.path.abspath(path) else writable(settings.textfile))
    if why:                               # found before anything is sent, as for records
        emit(f"{settings.prog}: cannot publish to --textfile {settings.textfile}: {why}; "
             f"choose a writable file in an existing folder", sys.stderr)
        if settings.json:
            emit_usage_json(f"cannot publish to --textfile: {why}")
        return EXIT_USAGE
    try:
        sink = open_records(path, settings.append)
    except OSError as exc:
        problem = (f"cannot write records to {path}: {exc.strerror or exc}; choose another "
                   f"file with --records PATH or WARMUP_RECORDS_DIR")
        emit(f"{settings.prog}: {problem}", sys.stderr)
        if settings.json:
            emit_usage_json(problem)
        if settings.textfile:
            publish_usage(program.mode, settings.textfile)
        return EXIT_USAGE
    printer = LineWriter(sys.stderr if settings.json else sys.stdout)
    if settings.textfile:                 # begun: a run KILLed from here on says so
        publish_result(settings, program.mode, {"verdict": "running"}, [], printer.say)
    run = Run(settings, program, Clock.start(settings.deadline_s, settings.socket_cap_s),
              sink, printer.say, started_at=utc_ms(time.time()))
    previous, summary = {}, None
    try:
        previous = install_signal_handlers()
        summary = conclude(run)
    except RecordsError as exc:      # evidence lost mid-run (a full disk): a failure
        printer.say(f"{settings.prog}: {exc}; the run stopped (exit {EXIT_FAIL})",
                    stream=sys.stderr)
        if settings.json:
            printer.say(json.dumps(dict(usage_object(str(exc)), exit_code=EXIT_FAIL)),
                        stream=sys.stdout)
        if settings.textfile:
            publish_result(settings, program.mode, {"verdict": "fail", "exit_code": EXIT_FAIL},
                           [], printer.say)
    finally:
        _terminating.set()           # from here on a signal changes nothing: ignore it
        restore_signal_handlers(previous)
        program.close()
        try:
            sink.close()
        except OSError:
            pass
    if summary is not None and settings.textfile:
        publish_result(settings, program.mode, summary, program.exported(run, summary),
                       printer.say)
    if summary is not None:
        printer.say(verdict_line(summary, path))
        if settings.json:
            printer.say(json.dumps(run.final_record or summary), stream=sys.stdout,
                        written=True)
    printer.flush(max(min(run.clock.remaining(), 1.0), 0.2))  # a stuck one: script_exit()
    return summary["exit_code"] if summary is not None else EXIT_FAIL


def publish_result(settings: RunSettings, mode: str, summary: dict, more: list,
                   say) -> None:
    """The run's result (or that it began) in the textfile; a failure to write it said."""
    textfile = plug_in("core.textfile")       # loaded with --textfile only (run_settings)
    prefix = f"offload_{mode}"
    why = textfile.publish(settings.textfile, prefix,
                           textfile.result_samples(prefix, summary, time.time()) + more)
    if why:
        say(f"{settings.prog}: {why}", stream=sys.stderr)


def conclude(run: Run) -> dict:
    """Run the steps; turn how they ended (normally, Fatal, a signal, a bug) into a summary."""
    try:
        run.program.steps(run)
        return summarize(run, Ending())
    except Fatal as exc:
        if exc.exit_code == EXIT_FAIL:    # judged as steps that ended, with this problem
            return summarize(run, Ending(problems=(exc.problem,)))
        verdict = "refused" if exc.exit_code == EXIT_REFUSED else "fail"   # or usage: 2
        return summarize(run, Ending(verdict, exc.exit_code, (exc.problem,)))
    except Terminated as exc:
        if exc.signum == signal.SIGTERM and hard_bound_reached():
            return summarize(run, Ending("killed", EXIT_HARD_BOUND, (
                f"ended by warmup_serve.sh's hard bound (TERM at "
                f"{os.environ.get('WARMUP_HARD_S', '?')} s){killed_where(run)}",)))
        return summarize(run, Ending("killed", 128 + exc.signum,
                                     (killed_problem(run, exc.signum),)))
    except RecordsError:
        raise
    except Exception as exc:             # a defect or an input nobody planned for
        if run.settings.debug:
            import traceback
            traceback.print_exc()
        return summarize(run, Ending("fail", EXIT_FAIL, (
            f"internal error{killed_where(run)}: {type(exc).__name__}: "
            f"{clean_text(str(exc), 200)} (run with --debug for the traceback)",)))


def summarize(run: Run, ending: Ending) -> dict:
    """Write the summary record: the program's verdict on the run, however its steps
    ended (normally, a Fatal, a signal, a defect); returns it."""
    _terminating.set()               # one summary: a signal from now on is ignored
    elapsed = run.clock.elapsed()
    program = run.program
    run.write_run_record()            # first: the verdict is judged from the run's records
    verdict, exit_code, problems = program.judge(run, ending)
    summary = {
        "record": "summary", "run_id": run.settings.run_id, "verdict": verdict,
        "exit_code": exit_code, **program.summary_fields(run),
        "elapsed_s": round(elapsed, 4), "deadline_s": run.settings.deadline_s,
        "problems": [sanitize_text(p, PROBLEM_LIMIT) for p in problems],
        "records": run.settings.records_path,
    }
    summary = run.write(summary)
    run.final_record = summary
    follow = program.after_summary(run, summary)
    if follow is not None:
        run.final_record = run.write(follow)
    return summary


def utc_ms(seconds_since_epoch: float) -> str:
    """A Unix time as UTC with milliseconds: 2026-12-01T23:57:43.512Z (joins worker logs)."""
    whole_s = math.floor(seconds_since_epoch)
    millis = min(int((seconds_since_epoch - whole_s) * 1000), 999)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole_s)) + f".{millis:03d}Z"


def killed_where(run: Run) -> str:
    return f" during {run.current}" if run.current else ""


def killed_problem(run: Run, signum: int) -> str:
    return f"terminated by {signal.Signals(signum).name}{killed_where(run)}"


def hard_bound_reached() -> bool:
    """True when warmup_serve.sh said when its hard bound falls (WARMUP_HARD_BOUND_AT, epoch
    seconds) and that moment has come: the TERM is the bound's, so the run ends with the
    wrapper's 124, not 143."""
    try:
        return time.time() >= float(os.environ["WARMUP_HARD_BOUND_AT"]) - 0.5
    except (KeyError, ValueError):
        return False


def records_name(kind: str, stamp: str) -> str:
    """How a records file is named: <kind>-<stamp>.jsonl (a run id, or start.sh's second)."""
    return f"{kind}-{stamp}.jsonl"


def default_records_path(run_id: str, kind: str = "warmup") -> str:
    directory = os.environ.get("WARMUP_RECORDS_DIR") or "warmup-records"
    return os.path.join(directory, records_name(kind, run_id))


def open_records(path: str, append: bool = False):
    """Open the records file (a regular file only) for appending; OSError when it cannot
    be written. One run to a file unless `append` (a later run KILLed before its run record
    would leave an earlier pass deciding it); a file cut mid-line gets a newline first."""
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    stream = open_own(path, "a")          # never through a link planted at the path
    size = os.fstat(stream.fileno()).st_size
    if size > 0 and not append:
        stream.close()
        raise OSError(0, "it already holds records (one run to a file: give a new path, "
                         "or --append)")
    if size > 0 and _last_byte(path) != b"\n":
        stream.write("\n")
        stream.flush()
    return stream


def _last_byte(path: str) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(-1, os.SEEK_END)
        return handle.read(1)


def append_record(stream, record: dict) -> None:
    """One JSON object a line, flushed at once, so a killed run keeps what finished."""
    try:
        line = json.dumps(record, allow_nan=False, ensure_ascii=False) + "\n"
        line.encode("utf-8")
    except UnicodeEncodeError:          # a lone surrogate somewhere: escape it, keep the record
        line = json.dumps(record, allow_nan=False) + "\n"
    stream.write(line)
    stream.flush()


class LineWriter:
    """Lines to streams through one daemon thread and a queue bounded in bytes: a stream
    nobody reads drops lines (counted), never holds the caller, never fills memory; one
    whose reader went away (`| head -1`) gets no more and is silenced, and the run goes
    on. A run's terminal lines, and under start.sh --supervise every line it prints."""

    def __init__(self, stream=None, max_bytes: int = 4 << 20):
        self.stream = stream                  # where say() writes unless told otherwise
        self.max_bytes, self.queued, self.dropped = max_bytes, 0, 0
        self.printing = False                 # a line taken and not yet printed
        self.closed: set = set()              # ids of streams whose reader went away
        self.lines: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = threading.Condition(self.lock)    # told when a line is done with
        self.thread = threading.Thread(target=self._run, name="lines", daemon=True)
        start_quiet(self.thread)

    def say(self, line: str, stream=None, written: bool = False) -> None:
        """Queue one line of ours (it may hold line breaks), sanitized here: the terminal
        sink. `written`: a record as Run.write wrote it (sanitized there), printed whole
        as --json's one JSON object, never cut."""
        self.put(line if written else sanitize_lines(line),
                 self.stream if stream is None else stream)

    def put(self, text: str, stream) -> None:
        """Queue text as it is (a stream None, closed at start, gets nothing)."""
        if stream is None:
            return
        with self.lock:
            if self.queued + len(text) > self.max_bytes:
                self.dropped += 1
                return
            self.queued += len(text)
        self.lines.put((text, stream))

    def _run(self) -> None:
        while True:
            text, stream = self.lines.get()
            with self.lock:
                self.queued -= len(text)
                self.printing = id(stream) not in self.closed
            if self.printing:
                try:
                    print(printable(text, stream), file=stream, flush=True)
                except (OSError, ValueError):
                    self.closed.add(id(stream))   # print no more to it; the logs keep it all
                    silence(stream)
            with self.lock:
                self.printing = False
                self.idle.notify_all()

    def flush(self, wait_s: float) -> bool:
        """Wait up to wait_s for the lines to go out; False when a line is still waiting
        or being printed (nobody reads): script_exit() then leaves without flushing the
        streams, or the interpreter's exit would wait on them."""
        with self.lock:
            drained = self.idle.wait_for(lambda: not (self.queued or self.printing), wait_s)
        if drained:                           # the last flush says how the output is:
            _stuck_output.clear()
        else:                                 # stuck, and script_exit() leaves without it
            _stuck_output.set()
        return drained


def verdict_line(summary: dict, records_path: str) -> str:
    """The terminal's last lines: the verdict with each part's count ('PASS (exit 0):
    contract 10/10 in 3.21 s'; a custom plan named with what made it, 'paths stream 5/5'),
    problems (five at most), notes and warnings, where the records are."""
    parts = summary.get("parts") or ()
    if parts:
        counts = parts_text(parts) + " in "
    elif "requests_total" in summary:
        counts = f"{summary['requests_ok']}/{summary['requests_total']} requests ok in "
    else:
        counts = "finished in "
    verdict = outcome(summary["verdict"], summary["exit_code"]).upper()
    if summary["verdict"] == "custom":        # only the contract's plan passes as PASS
        verdict = f"pass, custom plan: {'; '.join(summary.get('plan_differences', []))}"
    head = f"{verdict} (exit {summary['exit_code']}): {counts}{summary['elapsed_s']:.2f} s"
    reasons = summary["problems"][:5]
    if len(summary["problems"]) > 5:
        reasons.append(f"and {len(summary['problems']) - 5} more in the records")
    notes = "".join(f"\nnote: {n}" for n in summary.get("notes", []))
    notes += "".join(f"\nwarning: {w}" for w in summary.get("warnings", []))
    shape = shape_text(summary.get("shape"))
    return head + "".join(f"\n  - {p}" for p in reasons) + (f"\n{shape}" if shape else "") \
        + notes + f"\nrecords: {records_path}"


# The command line shared by every program.

def parse_or_explain(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args; with --json a usage error also prints a JSON object on stdout."""
    try:
        return parser.parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None) and "--json" in argv:
            emit_usage_json("usage error (see stderr)")
        raise


def usage_error(parser: argparse.ArgumentParser, as_json: bool, message: str):
    """A usage error found after parsing: with --json its object on stdout, then the
    parser's message and exit 2."""
    if as_json:
        emit_usage_json(message)
    parser.error(message)


def usage_object(problem: str) -> dict:
    """What --json prints when no summary could be written: a summary-shaped object."""
    return {"record": "summary", "verdict": "fail", "exit_code": EXIT_USAGE,
            "problems": [problem], "records": None}


def publish_usage(mode: str, textfile: str, verdict: str = "usage",
                  exit_code: int = EXIT_USAGE) -> None:
    """An outcome no summary says in the textfile (success 0): a usage error (a run that
    could not begin), or a KILL the run could not write down; no stale success stays."""
    try:
        why = plug_in("core.textfile").publish_outcome(textfile, mode, verdict, exit_code)
    except UsageError:                # its code is missing: the usage error says so
        return
    if why:
        emit(f"{why} (the outcome '{verdict}' was not published)", sys.stderr)


def textfile_of(argv: list[str]) -> str | None:
    """--textfile's value in a command line argparse could not parse (exact spellings
    only), else WARMUP_TEXTFILE: where a usage error is published."""
    for index, arg in enumerate(argv):
        if arg.startswith("--textfile="):
            return arg.partition("=")[2] or None
        if arg == "--textfile" and index + 1 < len(argv):
            return argv[index + 1]
    return os.environ.get("WARMUP_TEXTFILE") or None


def emit_usage_json(problem: str) -> None:
    """Print usage_object(problem) on stdout: --json's answer to a usage error."""
    emit(json.dumps(usage_object(problem)))


def add_run_options(parser: argparse.ArgumentParser, deadline_s: float | None = 90.0) -> None:
    """The options every run has: where its records go, its bounds, --json, --debug
    (deadline_s None: the program works its default out, WARMUP_DEADLINE_S first)."""
    parser.add_argument("--records", metavar="PATH",
                        help="JSON Lines records file of this run alone: one that holds "
                             "records already is a usage error unless --append (default: a "
                             "new <kind>-<run id>.jsonl in $WARMUP_RECORDS_DIR or "
                             "./warmup-records)")
    parser.add_argument("--append", action="store_true",
                        help="add this run's records after those already in --records "
                             "(qualify.py report judges the file by its last run)")
    shown = "$WARMUP_DEADLINE_S, else 90, or 5 s under a lower WARMUP_HARD_S (half one " \
        "under 10 s)" \
        if deadline_s is None else "%(default)g"
    parser.add_argument("--deadline-s", metavar="S", type=seconds(), default=deadline_s,
                        help=f"the deadline from the start; nothing starts after it and a run "
                             f"that ends after it fails (default: {shown}; at most 3600)")
    parser.add_argument("--socket-cap-s", metavar="S", type=seconds(), default=60.0,
                        help="the longest any one connect, send or read waits, within the "
                             "deadline (default: %(default)g)")
    parser.add_argument("--json", action="store_true",
                        help="print the summary record as JSON on stdout (also on a usage "
                             "error); the human lines go to stderr")
    parser.add_argument("--debug", action="store_true",
                        help="on an internal error, print the Python traceback to stderr")
    add_file_option(parser, "--textfile", "WARMUP_TEXTFILE",
                    "also publish the result for monitoring: Prometheus text (node_exporter's "
                    "textfile collector), written atomically; the last success's time is "
                    "kept when a run fails")


def add_file_option(parser: argparse.ArgumentParser, flag: str, variable: str,
                    help_text: str) -> None:
    """An option naming a file the run writes, its default from an environment variable."""
    parser.add_argument(flag, metavar="PATH", default=os.environ.get(variable) or None,
                        help=f"{help_text} (default: ${variable})")


def run_settings(args: argparse.Namespace, prog: str, kind: str) -> RunSettings:
    """RunSettings from add_run_options' options; a new run id."""
    run_id = new_run_id()
    if args.textfile:
        plug_in("core.textfile")          # a folder that lost it: a usage error, now
    return RunSettings(prog=prog, run_id=run_id,
                       records_path=args.records or default_records_path(run_id, kind),
                       deadline_s=args.deadline_s or 90.0, socket_cap_s=args.socket_cap_s,
                       json=args.json, debug=args.debug, textfile=args.textfile,
                       append=args.append)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + os.urandom(3).hex()


# Signals: every terminating signal the program can catch ends in one 'killed' summary.

_terminating = threading.Event()

_stuck_output = threading.Event()

_as_program = threading.Event()      # main() run as the process (not called by a test)

def as_program() -> None:
    """Say that main() runs as the process (not called by a test): after the summary the
    caught signals stay ignored until the interpreter exits."""
    _as_program.set()


_signalled = [False]                 # a plain flag: the handler takes no lock

def _raise_terminated(signum, frame):
    # A second signal can run this handler again inside the first one. Event.set() takes
    # a lock; had the first handler been holding it, the second would wait on it forever
    # (seen: two SIGTERMs 100 us apart hung a run). So the handler marks a plain flag
    # first and the Event, which takes the lock, only after.
    if _signalled[0] or _terminating.is_set():
        return
    _signalled[0] = True
    _terminating.set()
    raise Terminated(signum)


def install_signal_handlers() -> dict:
    previous = {}
    _terminating.clear()
    _signalled[0] = False
    if threading.current_thread() is threading.main_thread():
        for name in CAUGHT_SIGNALS:
            signum = getattr(signal, name, None)
            if signum is not None:
                previous[signum] = signal.signal(signum, _raise_terminated)
    return previous


def restore_signal_handlers(previous: dict) -> None:
    """Give the signals back to their previous handlers; as a program, keep ignoring them
    instead: a second TERM arriving after the summary must not kill the process untidily."""
    ignore = _as_program.is_set()       # SIG_IGN survives the interpreter's exit; our
    for signum, handler in previous.items():     # handler would become SIG_DFL there
        signal.signal(signum, signal.SIG_IGN if ignore else handler)


def script_exit(code: int) -> None:
    """Leave the process with `code`; a stdout nobody reads cannot hold the exit."""
    if _stuck_output.is_set():
        os._exit(code)               # flushing would wait on the reader forever
    sys.exit(code)


