"""The workflow's console (lenbatch_study.pipeline.console, Snakemake's logger plugin ``lenbatch``): two lines per
job in a real Snakemake run, progress lines with the time left from a job's log, Snakemake's own output for dry
runs, and no shell command (the params JSON) on the console, not even when a job fails."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from snakemake.settings.types import OutputSettings
from snakemake_interface_logger_plugins.common import LogEvent

from lenbatch_study.pipeline import console
from lenbatch_study.pipeline.deps import SRC_ROOT

REPO = SRC_ROOT.parent


def test_progress_is_the_last_count_of_the_text():
    assert console.parse_progress("11:47:13 train step 12/400 (epoch 0): loss 3.2") == ("step 12/400", 12, 400)
    line = "profile pass 1/2 (timed) over 16 grid points done, point 16/32, 3.1 s elapsed"
    assert console.parse_progress(line) == ("point 16/32", 16, 32)
    assert console.parse_progress("read 1,200/5,000 records, 0.4 M tokens") == ("read 1,200/5,000", 1200, 5000)
    assert console.parse_progress("a\nstep 1/9\nstep 2/9\n") == ("step 2/9", 2, 9)
    # no count, a count past its total, or a path/date: no progress
    for text in ("wrote results/tokenize", "step 5/3", "on 2026/12/02", "ratio 1/0", ""):
        assert console.parse_progress(text) is None, text


def test_time_left_is_the_rate_since_the_first_count():
    assert console.eta_seconds(10, 100.0, 30, 140.0, 110) == pytest.approx(160.0)
    assert console.eta_seconds(10, 100.0, 10, 140.0, 110) is None  # no movement yet: no rate
    assert [console.duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


def _handler(**settings):
    h = console.LogHandler(OutputSettings(**settings), None)
    h.stream = h.default.stream = io.StringIO()
    h.follow_logs = False  # the test calls poll() at the times it chooses
    return h


def _record(event, **extra):
    r = logging.LogRecord("snakemake", logging.INFO, __file__, 0, extra.pop("msg", ""), None, None)
    r.event = event
    r.__dict__.update(extra)
    return r


def test_a_job_prints_a_start_a_progress_line_with_time_left_and_an_end(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    h = _handler()
    h._emit(_record(LogEvent.RUN_INFO, stats={"train": 2, "all": 1, "total": 3}))
    start = _record(LogEvent.JOB_INFO, jobid=7, rule_name="train", wildcards={"strategy": "packed"}, log=[str(log)])
    end = _record(LogEvent.JOB_FINISHED, job_id=7)
    clock = iter([1000.0, 1100.0])  # the job's start and end, as the handler reads the time
    monkeypatch.setattr(console.time, "time", lambda: next(clock))
    h._emit(start)
    log.write_text("train step 1/100 (epoch 0)\n")
    assert h.poll(1005.0) == []  # 5 s in: a short job prints no progress; the rate is counted from here
    with log.open("a") as fh:
        fh.write("train step 21/100 (epoch 0)\n")
    # 20 steps in 15 s since the first count: 79 steps left take 59 s
    assert [line[9:] for line in h.poll(1020.0)] == ["train[packed]: step 21/100 (21%), 20 s so far, about 59 s left"]
    with log.open("a") as fh:
        fh.write("train step 41/100 (epoch 0)\n")
    assert h.poll(1040.0) == []  # at most one line per PROGRESS_EVERY seconds
    with log.open("a") as fh:
        fh.write("train step 51/100 (epoch 0)\n")
    # 50 steps in 55 s: 49 left take 54 s
    assert [line[9:] for line in h.poll(1060.0)] == [
        "train[packed]: step 51/100 (51%), 1 min 00 s so far, about 54 s left"]
    with log.open("a") as fh:
        fh.write("train step 100/100 (epoch 0)\n")
    assert h.poll(1095.0) == []  # finished: the end line follows
    h._emit(end)
    out = h.stream.getvalue().splitlines()
    assert out[0].endswith("2 jobs to run: train x2")
    assert out[1].endswith(f"train[packed]: started, log {log}")
    assert out[-1].endswith("train[packed]: done in 1 min 40 s (1 of 2 jobs)")
    assert len(out) == 5


def test_the_shell_command_stays_off_the_console_and_snakemakes_own_lines_print_as_they_are():
    """What is left out is chosen by Snakemake's events, never by the wording of its lines (issue 46, item 1)."""
    h = _handler()
    cmd = "lenbatch tokenize --params-json '{\"data\": 1}'"
    h._emit(_record(LogEvent.SHELLCMD, msg=f"Shell command: {cmd}", shellcmd=cmd))
    for msg in ("Building DAG of jobs...", "Nothing to be done (all requested files are present and up to date).",
                f"Command 'set -euo pipefail;  {cmd}' returned non-zero exit status 2."):
        h._emit(_record(None, msg=msg))
    assert h.stream.getvalue().splitlines() == [
        "Building DAG of jobs...", "Nothing to be done (all requested files are present and up to date).",
        f"Command 'set -euo pipefail;  {console.COMMAND_NOTE}' returned non-zero exit status 2."]


def _workflow(tmp_path: Path, fail: bool) -> Path:
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""
        rule all:
            input: "b.txt"
        rule a:
            output: "a.txt"
            log: "logs/a.log"
            params: cfg='{{"big": "{'x' * 2000}"}}'
            shell: "echo step 1/1 > {{log}}; echo {{params.cfg}} > {{output}}"
        rule b:
            input: "a.txt"
            output: "b.txt"
            log: "logs/b.log"
            shell: "echo 'it broke' > {{log}}; {'exit 3' if fail else 'cp {input} {output}'}"
    """))
    return tmp_path


def _snakemake(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC_ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("DVC_STAGE", None)  # set by DVC for its stage commands: the console then prints less
    exe = Path(sys.executable).with_name("snakemake")
    return subprocess.run([str(exe), "--cores", "1", "--logger", "lenbatch", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_real_run_prints_two_lines_per_job_and_a_dry_run_reads_as_snakemake_s(tmp_path):
    wf = _workflow(tmp_path, fail=False)
    dry = _snakemake(wf, "-n")
    assert dry.returncode == 0, dry.stderr
    assert "rule a:" in dry.stdout + dry.stderr and "Job stats:" in dry.stdout + dry.stderr
    run = _snakemake(wf, "-p")  # the workflow profile prints shell commands: the console still leaves them out
    assert run.returncode == 0, run.stderr
    lines = (run.stdout + run.stderr).splitlines()
    jobs = [line for line in lines if ": started, log " in line or ": done in " in line]
    assert [j.split(" ", 1)[1].split(",")[0].split(" in ")[0] for j in jobs] == [
        "a: started", "a: done", "b: started", "b: done"]
    assert "xxxxxxxxxx" not in run.stdout + run.stderr  # the params are not echoed
    # besides the jobs: Snakemake's own lines as it prints them, none of them a job's detail or shell line
    others = [line for line in lines if line not in jobs]
    assert not [line for line in others if "echo" in line or line.lstrip().startswith(("rule ", "input:"))], others


def test_a_failed_job_is_reported_with_its_log_but_without_its_shell_command(tmp_path):
    run = _snakemake(_workflow(tmp_path, fail=True), "--show-failed-logs", "-p")
    text = run.stdout + run.stderr
    assert run.returncode != 0
    assert "Error in rule b" in text and "logs/b.log" in text and "it broke" in text
    assert "exit 3" not in text and "xxxxxxxxxx" not in text


def test_under_a_dvc_stage_a_job_prints_one_line(monkeypatch, tmp_path):
    """DVC's own 'Running stage' line names the stage: the job adds only its end, with its log."""
    monkeypatch.setenv("DVC_STAGE", "tokenize")  # DVC sets it for every stage command
    h = _handler()
    h._emit(_record(LogEvent.RUN_INFO, stats={"tokenize": 1, "total": 1}))
    h._emit(_record(LogEvent.JOB_INFO, jobid=1, rule_name="tokenize", wildcards={}, log=["logs/tokenize.log"]))
    h._emit(_record(LogEvent.JOB_FINISHED, job_id=1))
    (line,) = h.stream.getvalue().splitlines()
    assert "tokenize: done in " in line and line.endswith(", log logs/tokenize.log")


def test_the_stages_progress_lines_give_the_console_its_counts():
    """What tokenize, profile and train write to their logs is what the console reads as k/N."""
    import numpy as np

    from lenbatch_study.runtime.schedule import ScheduledStep
    from lenbatch_study.corpus.sources import SourceReport
    from lenbatch_study.corpus.tokenizing import _Progress as TokenizeProgress
    from lenbatch_study.stages import profile
    from lenbatch_study.stages.train import progress_line

    report = SourceReport(path="x.jsonl", format="jsonl", bytes=2048 * 1024, bytes_read=512 * 1024)
    assert console.parse_progress(TokenizeProgress(None, False, report).done_of(10))[1:] == (512, 2048)
    assert console.parse_progress(TokenizeProgress(100, False, report).done_of(10))[1:] == (10, 100)
    step = ScheduledStep(step=11, epoch=0, rank=0, local=11, indices=np.zeros(1, np.int64), useful=100)
    assert console.parse_progress(progress_line(step, 40, float("nan"), 1200, 3.0))[1:] == (12, 40)
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    profile.log.addHandler(handler)
    try:
        note = profile._Progress(2, 16, 0.0)
        note.last = -100.0  # the next point is logged
        note.point(0, 4)
        note.pass_done(0, False)
    finally:
        profile.log.removeHandler(handler)
    assert [console.parse_progress(m)[1:] for m in seen] == [(5, 32), (16, 32)]


def test_with_one_count_seen_the_time_left_is_the_rate_since_the_job_started(tmp_path):
    log = tmp_path / "random.log"
    h = _handler()
    h._emit(_record(LogEvent.JOB_INFO, jobid=3, rule_name="train", wildcards={"strategy": "random"}, log=[str(log)]))
    job = h.jobs[3]
    job.started = 1000.0
    log.write_text("train step 3/5 (epoch 0)\n")
    # 3 steps in 14 s since the start: 2 left take 9 s
    assert [line[9:] for line in h.poll(1014.0)] == ["train[random]: step 3/5 (60%), 14 s so far, about 9 s left"]
