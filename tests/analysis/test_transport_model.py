"""The features' transport in the trainings' prediction: its fit on measured (bytes, seconds) points, the
step model's drafter critical path holding it, and compare's prediction using it for separate trainings only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lenbatch_study.analysis import shapes
from lenbatch_study.analysis import stepmodel as sm
from lenbatch_study.analysis import transport_model as tm
from lenbatch_study.core.config import load_params

REPO = Path(__file__).resolve().parents[2]


def test_fit_transport_recovers_latency_and_rate_from_measured_points():
    rng = np.random.default_rng(0)
    nbytes = np.array([1e5, 1e6, 4e6, 1.6e7, 6.4e7])
    # 0.3 ms per send plus 0.8 s/GB, every point timed 5 times with +-2% noise: the fit takes each point's median
    seconds = [list((3e-4 + 0.8e-9 * b) * (1 + 0.02 * rng.uniform(-1, 1, 5))) for b in nbytes]
    fit = sm.fit_transport(nbytes, seconds)
    assert fit.role == "receive" and fit.points == 5
    assert fit.const_s == pytest.approx(3e-4, rel=0.1) and fit.per_byte_s == pytest.approx(0.8e-9, rel=0.03)
    assert fit.error < 0.02
    assert fit.predict([2e6])[0] == pytest.approx(3e-4 + 1.6e-3, rel=0.03)
    assert fit.to_dict()["per_byte_s"] == fit.per_byte_s
    # exact on a noiseless line, single times per point accepted
    exact = sm.fit_transport([1e6, 2e6, 3e6], [1e-3 + 1e-9 * b for b in (1e6, 2e6, 3e6)], role="stage")
    assert exact.role == "stage" and exact.const_s == pytest.approx(1e-3) and exact.per_byte_s == pytest.approx(1e-9)
    # one size only: the rate through the origin
    one = sm.fit_transport([4e6, 4e6], [[4e-3], [4e-3]])
    assert one.const_s == 0.0 and one.per_byte_s == pytest.approx(1e-9)


def test_fit_transport_refuses_what_it_cannot_fit():
    with pytest.raises(ValueError, match="one time per size"):
        sm.fit_transport([1e6, 2e6], [1e-3])
    with pytest.raises(ValueError, match="finite and > 0"):
        sm.fit_transport([1e6, 2e6], [1e-3, 0.0])
    with pytest.raises(ValueError, match="bytes"):
        sm.fit_transport([1e6, -1.0], [1e-3, 1e-3])


def test_the_drafter_critical_path_includes_the_transport():
    n = 8
    # drafter-bound (targets 0.1 s, drafter 1 s): every step costs the drafter's receive plus its step
    t, d, x = np.full(n, 0.1), np.full(n, 1.0), np.full(n, 0.25)
    base = sm.pipeline_ends(t, d, queue_size=2)
    moved = sm.pipeline_ends(t, d, queue_size=2, transport_s=x)
    assert np.diff(base) == pytest.approx(np.full(n - 1, 1.0))
    assert np.diff(moved) == pytest.approx(np.full(n - 1, 1.25))
    tl = sm.pipeline_timeline(t, d, queue_size=2, transport_s=x)
    assert tl["compute_start"] == pytest.approx(tl["drafter_start"] + x)
    assert tl["end"] == pytest.approx(tl["compute_start"] + d)
    # target-bound (targets 2 s): the receive waits for the forward, then sits on the drafter's path before its
    # step, so each step ends x later but the rate is the targets'
    t2 = np.full(n, 2.0)
    ends = sm.pipeline_ends(t2, d, transport_s=x)
    assert ends == pytest.approx(2.0 * np.arange(1, n + 1) + 0.25 + 1.0)
    # the credit that frees a target rank's slot leaves once the batch is received: with one slot, the target
    # starts its step 2 when step 0 is received (0.1 s forward, taken at 0.1, received at 0.35), not when taken
    one = sm.pipeline_timeline(t, d, queue_size=1, transport_s=x)
    assert one["target_start"][2] == pytest.approx(0.35) and one["end"][0] == pytest.approx(1.35)
    # a scalar is every step's; the blended and the multi-node timelines carry it too
    assert sm.pipeline_ends(t, d, queue_size=2, transport_s=0.25) == pytest.approx(moved)
    bl = sm.blended_pipeline(t, t, d, d, queue_size=2, transport_s=x)
    assert bl["end"] == pytest.approx(moved)
    two = sm.pipeline_ends(np.full(n, 0.1), d, target_ranks=2, nodes=2, transport_s=x)
    assert np.diff(two[::2]) == pytest.approx(np.full(n // 2 - 1, 1.25))
    # one process (no drafter times apart) has no transport at all
    assert sm.pipeline_ends(t + d) == pytest.approx(np.cumsum(t + d))


def _transport(receive_s_per_gb: float) -> dict:
    fit = sm.TransportFit(role="receive", const_s=0.0, per_byte_s=receive_s_per_gb * 1e-9, error=0.0, points=2)
    stage = sm.TransportFit(role="stage", const_s=0.0, per_byte_s=0.0, error=0.0, points=2)
    return {"backend": "gloo", "receive": fit, "stage": stage}


def test_compare_predicts_separate_trainings_with_the_transport_and_one_process_without(tmp_path):
    from lenbatch_study.stages.compare import predict_steps

    lengths = np.array([100, 200, 300, 400] * 8)
    batches = [np.arange(i, i + 4) for i in range(0, 32, 4)]
    cols = shapes.batch_columns(lengths, batches, layout="padded", positions_per_seq=15.0)
    # a drafter-bound pipeline: the drafter step is 1 s, the target's 0.1 s
    fits = {
        "target": {"best": sm.StepFit("target", "c", ("const",), (0.1,), 0, 0, 0)},
        "drafter": {"best": sm.StepFit("drafter", "c", ("const",), (1.0,), 0, 0, 0)},
    }
    two = tmp_path / "two.yaml"
    two.write_text("train: {nproc: 2, warmup_steps: 1}\nprofile: {concurrent: false}\n")
    params = load_params(REPO / "params.yaml", two)
    m = params.model
    nbytes = shapes.transport_bytes(
        cols["computed_tokens"],
        cols["sequences"],
        feature_dim=len(m.target_layers) * m.hidden_size,
        itemsize=shapes.ITEMSIZE[m.dtype],
    )
    without = predict_steps(cols, fits=fits, params=params, target_ranks=1)
    withx = predict_steps(cols, fits=fits, params=params, target_ranks=1, transport=_transport(1000.0))
    assert without["transport_s"] is None
    assert withx["transport_s"] == pytest.approx(1e-6 * nbytes)
    # every post-warm-up step pays the drafter's receive on top of its step
    assert withx["seconds"] == pytest.approx(without["seconds"] + float(withx["transport_s"][1:].sum()))
    row = tm.transport_row([{"step": i, "transport_s": 0.5} for i in range(len(batches))], withx, warmup_steps=1)
    assert row == {
        "predicted_transport_s": pytest.approx(float(withx["transport_s"][1:].mean())),
        "measured_transport_s": 0.5,
    }
    assert np.isnan(tm.transport_row([{"step": 0}], without, warmup_steps=0)["predicted_transport_s"])
    # one process (train.nproc 1): no features move, the transport is not added
    one = tmp_path / "one.yaml"
    one.write_text("train: {nproc: 1, warmup_steps: 1}\n")
    p1 = load_params(REPO / "params.yaml", one)
    assert predict_steps(cols, fits=fits, params=p1, target_ranks=1, transport=_transport(1000.0))[
        "seconds"
    ] == pytest.approx(predict_steps(cols, fits=fits, params=p1, target_ranks=1)["seconds"])


def test_transport_bytes_are_the_tensors_the_target_rank_sends():
    """shapes.transport_bytes (compare's, numpy) counts what TargetLink.send puts on the data group."""
    import torch

    from lenbatch_study.stages.profile import make_batch

    params = load_params(REPO / "params.yaml")
    m = params.model
    fdim = len(m.target_layers) * m.hidden_size
    for layout, lens in (("padded", [64, 40, 17]), ("packed", [64, 40, 17])):
        batch = make_batch(layout, lens, params, seed=0)
        feats = torch.zeros(*batch.input_ids.shape, fdim, dtype=torch.float32)
        sent = [batch.input_ids, batch.loss_mask.to(torch.uint8), batch.lengths, batch.indices, feats]
        computed = batch.input_ids.numel()
        assert computed == (3 * 64 if layout == "padded" else sum(lens))
        want = shapes.transport_bytes(np.array([computed]), np.array([len(lens)]), feature_dim=fdim, itemsize=4)
        assert sum(t.numel() * t.element_size() for t in sent) == int(want[0])


def test_the_grid_reader_takes_the_transport_or_none_and_refuses_a_partial_one(tmp_path):
    """profile_grid.read_transport: a grid without the transport (older, or one process) reads as None (compare
    then predicts without it); rows that hold it in part, or a bytes count that is no number, are refused with
    the profile's rerun."""
    from lenbatch_study.pipeline.artifacts import profile_grid
    from lenbatch_study.pipeline.artifacts.reading import ArtifactError

    path = tmp_path / profile_grid.GRID
    rows = [
        {
            "transport_bytes": 1000 * (i + 1),
            "transport_seconds_all": [1e-3 * (i + 1)],
            "transport_stage_s_all": [0.0],
            "transport_backend": "gloo",
        }
        for i in range(3)
    ]
    got = profile_grid.read_transport(path, rows, rerun="snakemake results/profile/grid.json")
    assert got == {
        "backend": "gloo",
        "bytes": [1000.0, 2000.0, 3000.0],
        "seconds": [[1e-3], [2e-3], [3e-3]],
        "stage": [[0.0], [0.0], [0.0]],
    }
    assert profile_grid.read_transport(path, [{}, {}], rerun="x") is None
    with pytest.raises(ArtifactError, match="in 2 of its 3 rows.*rerun: snakemake results/profile/grid.json"):
        profile_grid.read_transport(path, rows[:2] + [{}], rerun="snakemake results/profile/grid.json")
    with pytest.raises(ArtifactError, match="transport_bytes='many'"):
        profile_grid.read_transport(path, [dict(rows[0], transport_bytes="many")], rerun="x")
