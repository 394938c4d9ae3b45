"""lenbatch_study.runtime.interrupt: the Snakefile's SIGINT handler, on real processes (the whole path, Snakemake
and a training included, is tests/pipeline/test_workflow_e2e.py::test_sigint_to_snakemake_*)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lenbatch_study.runtime.interrupt import descendants, start_time, wait_stopped

from _tiny import ENV

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")

# counts the SIGINTs it gets (a second one arrives within milliseconds of the first when it is sent twice) and
# writes the count to argv[2] when it exits: 0.5 s after its first SIGINT (argv[1] "signal"), or 1 s after the file
# argv[1] appears (a process that stops later than the others); after 60 s in any case
COUNTER = r"""
import os, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda *a: got.append(time.time()))
t0, until = time.time(), sys.argv[1]
while time.time() - t0 < 60:
    if until == "signal" and got and time.time() - got[0] > 0.5:
        break
    if until != "signal" and os.path.exists(until):
        time.sleep(1)
        break
    time.sleep(0.02)
open(sys.argv[2], "w").write(str(len(got)))
"""

# installs the handler (twice: the Snakefile may be parsed twice in one process), starts a job in its own process
# group (a launcher) and one in a session of its own (a torchrun worker: its launcher hands it the interrupt),
# and reports what it sees when the interrupt reaches it as KeyboardInterrupt
SNAKEMAKE = r"""
import os, subprocess, sys, time
from lenbatch_study.runtime.interrupt import install
assert install(wait_s=30) and install(wait_s=30)
out = sys.argv[1]
group = subprocess.Popen([sys.executable, "-c", sys.argv[2], "signal", out + "/group"])
session = subprocess.Popen([sys.executable, "-c", sys.argv[2], out + "/group", out + "/session"],
                           start_new_session=True)
print("ready", flush=True)
try:
    time.sleep(60)
except KeyboardInterrupt:
    ended = [os.path.exists(out + "/group"), os.path.exists(out + "/session")]
    print("interrupted", *ended, flush=True)
"""


def test_the_interrupt_reaches_the_group_once_and_the_handler_waits_for_every_job_process(tmp_path):
    """kill -INT of the process alone: its job in its own group gets one SIGINT (before: one per descendant
    walk, and two where the job also got it otherwise); the one in a session of its own gets none (its launcher
    would hand it on); KeyboardInterrupt comes only once both have ended (the second 1 s after the first)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SNAKEMAKE, str(tmp_path), COUNTER],
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # no terminal
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1)  # both children are running their loops
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert out.split() == ["interrupted", "True", "True"], out
    assert (tmp_path / "group").read_text() == "1"
    assert (tmp_path / "session").read_text() == "0"


def test_start_time_tells_a_process_from_its_exit_and_descendants_cross_sessions(tmp_path):
    """start_time: a string for a running process, None for a zombie and for a reaped one; descendants: a
    grandchild in a session of its own is found (torchrun's workers are)."""
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'],"
        " start_new_session=True); print('ok', flush=True); time.sleep(30)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ok"
        tree = descendants(parent.pid)
        assert len(tree) == 1 and os.getsid(tree[0]) == tree[0] != os.getsid(parent.pid)
        assert start_time(parent.pid) is not None and start_time(tree[0]) is not None
        grandchild = tree[0]
        os.kill(parent.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while Path(f"/proc/{parent.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert start_time(parent.pid) is None  # a zombie, not yet reaped
    finally:
        parent.kill()
        parent.wait()
        try:
            os.kill(grandchild, signal.SIGKILL)
        except (NameError, ProcessLookupError):
            pass
    assert start_time(parent.pid) is None


def test_wait_stopped_gives_up_after_its_bound_naming_what_still_runs():
    """A process that does not stop: after wait_s the pids left are returned and named; one that ends is not
    waited for longer than it runs; a recorded pid whose start time differs (reused) counts as ended."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        out = io.StringIO()
        left = wait_stopped({sleeper.pid: start_time(sleeper.pid)}, wait_s=1.5, out=out)
        assert left == [sleeper.pid] and f"pids {sleeper.pid}" in out.getvalue()
        assert "waiting for 1 process(es)" in out.getvalue()
        t0 = time.monotonic()
        assert wait_stopped({quick.pid: start_time(quick.pid), sleeper.pid: "0"}, wait_s=20, out=out) == []
        assert time.monotonic() - t0 < 10
    finally:
        sleeper.kill()
        quick.kill()
        sleeper.wait()
        quick.wait()
