"""The run summary measures every session of a resumed run (lenbatch_study.runtime.records)."""

import json
from pathlib import Path

import yaml

from lenbatch_study.core.config import load_params
from lenbatch_study.pipeline.artifacts.train_runs import STEPS
from lenbatch_study.runtime.records import Recorder

ROOT = Path(__file__).resolve().parents[2]


def tiny_params():
    return load_params(str(ROOT / "params.yaml"), json.dumps(yaml.safe_load(open(ROOT / "configs/tiny.yaml"))))


def _row(step: int, t: float, useful: int = 100) -> dict:
    return {
        "rank": 0,
        "step": step,
        "epoch": 0,
        "t": t,
        "useful_tokens": useful,
        "computed_tokens": useful,
        "target_s": 0.1,
        "drafter_s": 0.1,
        "queue_wait_s": 0.0,
        "credit_wait_s": 0.0,
        "loss": 1.0,
        "target_cpu_s": 0.1,
        "drafter_cpu_s": 0.1,
    }


def _summary(rec: Recorder, warmup: int = 1) -> dict:
    s = rec.summary(
        params=tiny_params(),
        strategy="packed",
        warmup=warmup,
        world_size=2,
        target_ranks=1,
        resumed_from=None,
        total_steps=5,
    )
    rec.close()
    return s


def test_a_resume_one_step_before_the_end_keeps_the_first_sessions_throughput(tmp_path):
    """The SLURM check requeues a training; requeued at step 4 of 5, the resumed session's single step is its
    warm-up, and the summary used to say useful_tokens_per_s: null (compare then refused the run)."""
    first = Recorder(tmp_path / STEPS, kept=None)
    for i, t in enumerate([1.0, 2.0, 3.0, 5.0]):  # warm-up step 0, then 3 measured steps in 4 s
        first.add(_row(i, t))
    first.close()
    kept = (tmp_path / STEPS).read_text().splitlines()
    resumed = Recorder(tmp_path / STEPS, kept=kept)
    resumed.add(_row(4, 0.5))
    s = _summary(resumed)
    assert [json.loads(line)["session"] for line in (tmp_path / STEPS).read_text().splitlines()] == [0, 0, 0, 0, 1]
    assert (s["sessions"], s["measured_steps"], s["warmup_steps_excluded"]) == (2, 3, 2)
    assert s["measured_wall_s"] == 4.0 and s["useful_tokens_per_s"] == 300 / 4.0


def test_every_session_contributes_its_own_post_warm_up_steps_on_its_own_clock(tmp_path):
    first = Recorder(tmp_path / STEPS, kept=None)
    for i, t in enumerate([1.0, 2.0, 4.0]):  # measured: steps 1-2, 3 s after the warm-up's end
        first.add(_row(i, t))
    first.close()
    resumed = Recorder(tmp_path / STEPS, kept=(tmp_path / STEPS).read_text().splitlines())
    for i, t in enumerate([10.0, 11.0, 13.0], start=3):  # its own clock: measured steps 4-5, 3 s after its warm-up
        resumed.add(_row(i, t, useful=200))
    s = _summary(resumed)
    assert s["measured_steps"] == 4 and s["measured_wall_s"] == 6.0
    assert s["useful_tokens_per_s"] == (2 * 100 + 2 * 200) / 6.0


def test_a_run_too_short_for_its_warm_up_has_no_throughput(tmp_path):
    rec = Recorder(tmp_path / STEPS, kept=None)
    rec.add(_row(0, 1.0))
    s = _summary(rec)
    assert s["useful_tokens_per_s"] is None and s["measured_steps"] == 0 and s["sessions"] == 1
