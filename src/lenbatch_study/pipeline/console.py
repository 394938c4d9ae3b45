"""Snakemake's console in one or two lines per job: the workflow profile's ``logger: lenbatch``.

Snakemake finds the handler by its module name, ``snakemake_logger_plugin_lenbatch`` (a shim beside this
package that imports :class:`LogHandler`). A run then prints, per job:

- when it starts: the job (``train[packed]``) and its log file (under DVC, whose ``Running stage`` line
  already says it, only the end);
- when it ends: how long it took and how many of the run's jobs are done;
- while it runs, whenever its log reports progress as ``<word> k/N`` (a training's ``step k/N``, the
  profile's ``point k/N``, tokenize's ``read k/N records`` or KiB): the latest such count, the elapsed time
  and the time left, extrapolated from the rate since the first count seen, or since the job started
  while only one has been seen (:func:`eta_seconds`); at most one line per :data:`PROGRESS_EVERY` seconds
  per job, none before :data:`PROGRESS_AFTER` seconds, so a short job stays at two lines.

Shell commands are not printed (each carries its stage's params JSON, up to a few KB; Snakemake's own log,
``.snakemake/log``, and a dry run have them). Warnings, errors and Snakemake's other lines print as Snakemake
prints them, with any job's shell command (known from the job's start event, never read out of a message's
wording) replaced by :data:`COMMAND_NOTE` (the job's log starts with what it read). What is left out is
chosen by Snakemake's structured events only, never by the text of its lines: a reworded Snakemake line
prints as it is. Dry runs (``-n``), ``--verbose`` and
``--debug-dag`` print exactly Snakemake's default output, so ``snakemake -n`` reads as always. Snakemake's
own log file (``.snakemake/log``) is written by its default file handler, which this does not replace.
Cost: one regular-expression scan of each running job's new log bytes per :data:`POLL_SECONDS`.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from snakemake.logging import ColorizingTextHandler, DefaultFilter, DefaultFormatter
from snakemake_interface_logger_plugins.base import LogHandlerBase
from snakemake_interface_logger_plugins.common import LogEvent

POLL_SECONDS = 1.0
PROGRESS_AFTER = 10.0   # a job shorter than this prints no progress line
PROGRESS_EVERY = 30.0   # at most one progress line per job per this many seconds

# "step 12/400", "pass 1/2", "read 1,200/5,000 records": a word, then done/total
_NUM = r"(?:\d{1,3}(?:,\d{3})+|\d+)"  # 1,200 or 1200
PROGRESS = re.compile(rf"\b(?P<word>[A-Za-z]+) (?P<k>{_NUM})/(?P<n>{_NUM})(?![\d/])")
# what stands in a message for a job's shell command (Snakemake's own log keeps the command)
COMMAND_NOTE = "<the job's shell command: in Snakemake's log>"


def duration(seconds: float) -> str:
    """42 s, 3 min 05 s, 1 h 12 min."""
    s = int(round(max(seconds, 0.0)))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def eta_seconds(k0: int, t0: float, k: int, t: float, n: int) -> Optional[float]:
    """Seconds left at ``k`` of ``n`` units done at time ``t``, at the rate since ``k0`` were done at ``t0``:
    (t - t0) / (k - k0) * (n - k). None until the count has moved (no rate yet)."""
    if k <= k0 or t <= t0:
        return None
    return (t - t0) / (k - k0) * max(n - k, 0)


def parse_progress(text: str) -> Optional[tuple[str, int, int]]:
    """The last ``<word> k/N`` of ``text`` with 0 <= k <= N and N > 0: (that phrase, k, N); None when there is none."""
    last = None
    for m in PROGRESS.finditer(text):
        k, n = int(m["k"].replace(",", "")), int(m["n"].replace(",", ""))
        if n > 0 and 0 <= k <= n:
            last = (f"{m['word']} {m['k']}/{m['n']}", k, n)
    return last


@dataclass
class Job:
    """A running job as the console follows it."""

    label: str
    logs: list[str]
    started: float
    offsets: dict[str, int] = field(default_factory=dict)
    first: Optional[tuple[int, float]] = None   # (k, time) of the first progress seen
    latest: Optional[tuple[str, int, int]] = None
    printed: float = 0.0                         # when its last progress line was printed
    printed_k: int = -1


def job_label(rule: str, wildcards: Any) -> str:
    """``train[packed]``: the rule and its wildcard values."""
    if isinstance(wildcards, dict):
        values = [str(v) for v in wildcards.values()]
    else:
        values = [str(v) for v in (wildcards or [])]
    return f"{rule}[{','.join(values)}]" if values else rule


class LogHandler(LogHandlerBase):
    """Snakemake's stream handler for the workflow profile (module doc)."""

    def __post_init__(self) -> None:
        s = self.common_settings
        self.default = ColorizingTextHandler(nocolor=getattr(s, "nocolor", False),
                                             stream=sys.stdout if getattr(s, "stdout", False) else sys.stderr)
        self.default.addFilter(DefaultFilter(s.quiet, s.debug_dag, s.verbose, s.dryrun, s.printshellcmds))
        self.default.setFormatter(DefaultFormatter(s.quiet, s.show_failed_logs))
        self.compact = not (s.dryrun or s.verbose or s.debug_dag)
        self.stream = self.default.stream
        self.stage_only = "DVC_STAGE" in os.environ  # under a DVC stage command (DVC sets it for each)
        self.jobs: dict[int, Job] = {}
        self.commands: set[str] = set()  # the shell commands of the jobs seen, to keep off the console
        self.failed = False
        self.done = 0
        self.total: Optional[int] = None
        self.lock = threading.RLock()
        self.stop = threading.Event()
        self.thread: Optional[threading.Thread] = None
        self.follow_logs = True  # False: no thread; poll() reads the logs when called (tests)

    # LogHandlerBase's declarations
    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return True

    @property
    def has_formatter(self) -> bool:
        return True

    @property
    def needs_rulegraph(self) -> bool:
        return False

    def write(self, line: str) -> None:
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.compact:
            self.default.handle(record)
            return
        try:
            self._emit(record)
        except Exception:  # noqa: BLE001 - a console glitch must never stop the workflow
            self.handleError(record)

    def _emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "event", None)
        now = time.time()
        if event == LogEvent.WORKFLOW_STARTED or event == LogEvent.PROGRESS or event == LogEvent.RESOURCES_INFO \
                or event == LogEvent.JOB_STARTED:
            return
        if event == LogEvent.RUN_INFO:
            stats = getattr(record, "stats", None)
            if isinstance(stats, dict) and "total" in stats:
                counts = {r: int(c) for r, c in stats.items() if r not in ("total", "all")}
                self.total = sum(counts.values())
                jobs = [r + (f" x{c}" if c > 1 else "") for r, c in counts.items()]
                if jobs and not self.stage_only:
                    self.write(f"{_clock()} {self.total} jobs to run: {', '.join(jobs)}")
            return
        if event == LogEvent.JOB_INFO:
            self._start(record, now)
            return
        if event == LogEvent.JOB_FINISHED:
            self._finish(getattr(record, "job_id", None), now)
            return
        if event == LogEvent.SHELLCMD:  # the params JSON: Snakemake's log and a dry run show it
            self._remember(getattr(record, "shellcmd", None))
            return
        if event in (LogEvent.JOB_ERROR, LogEvent.GROUP_ERROR):
            quiet = copy.copy(record)
            if hasattr(quiet, "shellcmd"):
                self._remember(quiet.shellcmd)
                quiet.shellcmd = None  # the params JSON; the job's log names what it read
            with self.lock:
                self.failed = True
                self.jobs.pop(getattr(record, "jobid", None), None)
                self.default.handle(self._without_commands(quiet))
            return
        with self.lock:
            self.default.handle(self._without_commands(record))

    def _remember(self, command: Any) -> None:
        if isinstance(command, str) and command.strip():
            with self.lock:
                self.commands.add(command.strip())

    def _without_commands(self, record: logging.LogRecord) -> logging.LogRecord:
        """``record`` with every shell command of a job seen replaced by :data:`COMMAND_NOTE` (a failed job's
        exception repeats its command, and with it the stage's params JSON)."""
        msg = record.getMessage()
        short = msg
        for command in sorted(self.commands, key=len, reverse=True):
            short = short.replace(command, COMMAND_NOTE)
        if short == msg:
            return record
        record = copy.copy(record)
        record.msg, record.args = short, None
        return record

    def _start(self, record: logging.LogRecord, now: float) -> None:
        rule = getattr(record, "rule_name", "?")
        self._remember(getattr(record, "shellcmd", None))
        if rule == "all":
            return
        logs = [str(p) for p in (getattr(record, "log", None) or [])]
        job = Job(label=job_label(rule, getattr(record, "wildcards", None)), logs=logs, started=now)
        with self.lock:
            self.jobs[getattr(record, "jobid", id(job))] = job
        if not self.stage_only:
            self.write(f"{_clock()} {job.label}: started" + (f", log {logs[0]}" if logs else ""))
        if self.thread is None and self.follow_logs:
            self.thread = threading.Thread(target=self._poll_loop, name="lenbatch-console", daemon=True)
            self.thread.start()

    def _finish(self, jobid: Any, now: float) -> None:
        with self.lock:
            job = self.jobs.pop(jobid, None)
            if job is None:  # rule all
                return
            self.done += 1
        of = f" ({self.done} of {self.total} jobs)" if self.total and not self.stage_only else ""
        where = f", log {job.logs[0]}" if job.logs and self.stage_only else ""
        self.write(f"{_clock()} {job.label}: done in {duration(now - job.started)}{of}{where}")

    def _poll_loop(self) -> None:
        while not self.stop.wait(POLL_SECONDS):
            try:
                self.poll(time.time())
            except Exception:  # noqa: BLE001 - a log that vanished mid-read: try again next time
                pass

    def poll(self, now: float) -> list[str]:
        """Read every running job's new log lines; print (and return) the progress lines now due."""
        out = []
        with self.lock:
            jobs = list(self.jobs.values())
        for job in jobs:
            for path in job.logs:
                text = _read_new(path, job.offsets)
                found = parse_progress(text) if text else None
                if found is not None:
                    job.latest = found
                    if job.first is None:
                        job.first = (found[1], now)
            line = progress_line(job, now)
            if line is not None:
                job.printed, job.printed_k = now, job.latest[1]
                out.append(line)
                self.write(line)
        return out

    def close(self) -> None:
        self.stop.set()
        super().close()


def progress_line(job: Job, now: float) -> Optional[str]:
    """The job's progress line when one is due (module doc), else None."""
    if job.latest is None or now - job.started < PROGRESS_AFTER or now - job.printed < PROGRESS_EVERY:
        return None
    phrase, k, n = job.latest
    if k == job.printed_k or k == n:  # nothing new, or finished: the end line follows
        return None
    left = eta_seconds(job.first[0], job.first[1], k, now, n) if job.first else None
    if left is None:  # one count seen so far: the rate since the job started (start-up included)
        left = eta_seconds(0, job.started, k, now, n)
    tail = f", about {duration(left)} left" if left is not None else ""
    return f"{_clock()} {job.label}: {phrase} ({100 * k / n:.0f}%), {duration(now - job.started)} so far{tail}"


def _read_new(path: str, offsets: dict[str, int]) -> str:
    """The bytes of ``path`` after ``offsets[path]`` (decoded), advancing it; '' when it does not exist yet."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offsets.get(path, 0))
            data = fh.read()
    except OSError:
        return ""
    offsets[path] = offsets.get(path, 0) + len(data)
    return data.decode("utf-8", "replace")


def _clock() -> str:
    return time.strftime("%H:%M:%S")


__all__ = ["LogHandler", "duration", "eta_seconds", "parse_progress", "progress_line"]
