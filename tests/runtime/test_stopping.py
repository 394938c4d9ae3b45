"""The stop request of a training process (lenbatch_study.runtime.stopping): a real signal to this process sets
it and nothing else, the first one wins, the handlers come back (or stay ignored in a torchrun worker), and
the marker the launching shell reads round-trips. The signalled trainings themselves:
tests/stages/test_train_signal.py."""

from __future__ import annotations

import os
import signal

import pytest

from lenbatch_study.runtime.stopping import STOP_SIGNALS, StopRequest, read_marker, stop_line, write_marker


def test_a_signal_only_sets_the_request_and_the_first_one_wins():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop = StopRequest()
    with stop.installed():
        assert stop.signum == 0 and stop.name == ""
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered to this (main) thread before kill returns
        assert stop.signum == signal.SIGUSR1 and stop.name == "SIGUSR1"
        os.kill(os.getpid(), signal.SIGTERM)  # the process goes on: the step in flight finishes
        assert stop.name == "SIGUSR1"
        stop.note(0)  # a peer that received none changes nothing
        assert stop.name == "SIGUSR1"
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before


def test_a_peer_s_signal_is_noted_and_a_worker_keeps_the_signals_ignored_after():
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop = StopRequest()
    try:
        with stop.installed(restore=False):
            stop.note(int(signal.SIGTERM))
            assert stop.name == "SIGTERM"
        # on its way out a stopped worker must not die of its agent's SIGTERM
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in STOP_SIGNALS)
        os.kill(os.getpid(), signal.SIGTERM)
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_the_marker_round_trips_and_is_absent_otherwise(tmp_path):
    marker = tmp_path / "stopped.json"
    assert read_marker(marker) is None
    write_marker(marker, signal_name="SIGUSR1", step=12)
    assert read_marker(marker) == {"signal": "SIGUSR1", "step": 12}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stopped.json"]  # no temp file left
    marker.write_text("{torn")
    assert read_marker(marker) is None
    line = stop_line("SIGUSR1", 12, tmp_path / "checkpoint.pt")
    assert line.startswith("stopped on SIGUSR1 at step 12, checkpoint written") and "rerun with --resume" in line


def test_a_second_ctrl_c_aborts_at_once():
    """The first SIGINT only asks for a stop at the next step boundary; a person who presses Ctrl-C again will
    not wait for it."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    stop = StopRequest()
    with stop.installed():
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
