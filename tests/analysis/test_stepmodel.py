"""Step-time model: the NNLS fit recovers known coefficients, model choice, pipeline simulation."""

from __future__ import annotations

import numpy as np
import pytest

from lenbatch_study.analysis import shapes as shp
from lenbatch_study.analysis import stepmodel as sm
from lenbatch_study.core import cpu


def _grid_columns():
    shapes = []
    for n in (1, 2, 4, 8, 16, 32, 64):
        for m in (128, 256, 512, 1024, 2048, 4096):
            if n * m <= 16384:
                shapes.append(("padded", shp.grid_shape("padded", n, m)))
    for k in (1, 4, 16):
        for L in (1024, 4096, 16384):
            shapes.append(("packed", shp.grid_shape("packed", k, L)))
    lengths = np.concatenate([np.asarray(ls) for _, ls in shapes])
    cols: dict[str, list] = {}
    start = 0
    for layout, ls in shapes:
        batch = [np.arange(start, start + len(ls))]
        start += len(ls)
        one = shp.batch_columns(lengths, batch, layout=layout)
        for key, value in one.items():
            cols.setdefault(key, []).append(value[0])
    return {k: np.asarray(v) for k, v in cols.items()}


TRUE = {"const": 0.004, "computed_tokens": 2e-6, "sum_len_sq": 3e-10, "sequences": 5e-4}


def test_fit_recovers_known_coefficients_from_synthetic_timings():
    cols = _grid_columns()
    feats = tuple(TRUE)
    X = sm.design_matrix(cols, feats)
    truth = np.array([TRUE[f] for f in feats])
    rng = np.random.default_rng(0)
    seconds = X @ truth * (1 + 0.005 * rng.standard_normal(len(X)))  # 0.5 % timing noise
    coef = sm.fit_coefficients(X, seconds)
    assert np.allclose(coef, truth, rtol=0.1), (coef, truth)
    exact = sm.fit_coefficients(X, X @ truth)
    assert np.allclose(exact, truth, rtol=1e-6)


def test_nnls_keeps_coefficients_non_negative_and_matches_kkt():
    rng = np.random.default_rng(1)
    X = rng.uniform(0, 1, size=(40, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 3.0
    b = sm.nnls(X, y)
    assert np.all(b >= 0)
    grad = X.T @ (X @ b - y)
    # KKT: zero gradient on the support, non-negative gradient off it
    assert np.all(np.abs(grad[b > 0]) < 1e-6 * np.abs(X.T @ y).max())
    assert np.all(grad[b == 0] >= -1e-8)
    assert b[1] == 0.0


def test_select_model_prefers_the_true_feature_set_on_held_out_points():
    cols = _grid_columns()
    rng = np.random.default_rng(2)
    X = sm.design_matrix(cols, tuple(TRUE))
    seconds = X @ np.array(list(TRUE.values())) * (1 + 0.003 * rng.standard_normal(len(X)))
    best, fits = sm.select_model(cols, seconds, role="target", holdout_fraction=0.25)
    assert best.name == "tokens+attn+seq"
    assert best.holdout_error < 0.01
    simple = next(f for f in fits if f.name == "tokens")
    assert simple.holdout_error > best.holdout_error + 0.02


def test_lm_chunks_count_the_lm_head_chunks_of_each_step():
    from lenbatch_study.models.drafter import CE_CHUNK_ROWS

    lengths = np.full(4, 600)
    steps = [np.arange(4)] * 5
    positions = np.array([1.0, CE_CHUNK_ROWS, CE_CHUNK_ROWS + 1, 2 * CE_CHUNK_ROWS, 2 * CE_CHUNK_ROWS + 1])
    cols = shp.batch_columns(lengths, steps, layout="padded", drafter=(positions, np.full(5, 2400.0)))
    assert cols["lm_chunks"].tolist() == [1, 1, 2, 2, 3]
    est = shp.batch_columns(lengths, steps[:1], layout="padded", positions_per_seq=40.0)  # 160 positions
    assert est["lm_chunks"].tolist() == [2]
    assert np.isnan(shp.batch_columns(lengths, steps[:1], layout="padded")["lm_chunks"][0])
    # a grid point's mean over steps of 100 and 200 positions: 1.5 chunks, where its mean positions make 2
    grid = shp.batch_columns(
        lengths, steps[:1], layout="padded", drafter=(np.array([150.0]), np.array([2400.0])), lm_chunks=np.array([1.5])
    )
    assert grid["lm_chunks"].tolist() == [1.5]


def _drafter_grid() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    n = 40
    positions = rng.integers(10, 600, n).astype(np.float64)
    return {
        "const": np.ones(n),
        "computed_tokens": rng.integers(512, 16384, n).astype(np.float64),
        "positions": positions,
        "lm_chunks": np.ceil(positions / 128),
        "ctx_tokens": rng.integers(512, 24000, n).astype(np.float64),
        "sequences": np.ceil(positions / 15),
    }


def test_drafter_model_takes_the_chunk_term_when_chunks_cost_and_only_then():
    cols = _drafter_grid()
    rng = np.random.default_rng(6)
    noise = 1 + 0.005 * rng.standard_normal(len(cols["const"]))
    linear = (0.02 + 7e-6 * cols["computed_tokens"] + 2.2e-3 * cols["positions"]) * noise
    best, _ = sm.select_model(cols, linear, role="drafter", holdout_fraction=0.25)
    assert best.name == "tokens+pos"
    stepped = linear + 0.02 * cols["lm_chunks"] * noise
    best, fits = sm.select_model(cols, stepped, role="drafter", holdout_fraction=0.25)
    assert best.name == "tokens+pos+chunks", [(f.name, f.holdout_error) for f in fits]
    assert dict(zip(best.features, best.coef))["lm_chunks"] == pytest.approx(0.02, rel=0.15)
    # a grid recorded before the chunks were (NaN): the candidate is left out, not fitted on guesses
    old = {**cols, "lm_chunks": np.full(len(cols["const"]), np.nan)}
    _, fits = sm.select_model(old, stepped, role="drafter", holdout_fraction=0.25)
    assert {f.name for f in fits} == {"tokens", "tokens+pos", "tokens+seq", "tokens+pos+ctx"}


def test_too_small_a_grid_names_the_rerun():
    cols = {k: v[:3] for k, v in _grid_columns().items()}
    with pytest.raises(ValueError, match="rerun: snakemake results/profile/grid.json"):
        sm.select_model(cols, np.ones(3), role="target", holdout_fraction=0.25)


def test_prediction_on_timed_steps_matches_their_sum():
    """A plan whose steps were timed: the predicted epoch time equals the sum of the step times."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(20, 2000, size=300)
    order = rng.permutation(300)
    batches = [order[i : i + 10] for i in range(0, 300, 10)]
    cols = shp.batch_columns(lengths, batches, layout="padded")
    truth = np.array([0.01, 1e-6, 2e-10, 1e-3])
    feats = ("const", "computed_tokens", "sum_len_sq", "sequences")
    timed = sm.design_matrix(cols, feats) @ truth  # "measured" step times
    coef = sm.fit_coefficients(sm.design_matrix(cols, feats), timed)
    fit = sm.StepFit("target", "x", feats, tuple(coef), 0, 0, 0)
    ends = sm.pipeline_ends(fit.predict(cols))
    assert ends[-1] == pytest.approx(timed.sum(), rel=1e-9)
    tput = sm.throughput(cols["useful_tokens"], ends, warmup_steps=0)
    assert tput == pytest.approx(lengths.sum() / timed.sum(), rel=1e-9)


def test_pipeline_costs_the_slower_role_in_steady_state():
    t = np.full(100, 0.2)
    d = np.full(100, 0.5)
    ends = sm.pipeline_ends(t, d, queue_size=4)
    assert ends[-1] == pytest.approx(0.2 + 100 * 0.5)
    ends = sm.pipeline_ends(d, t, queue_size=4)
    assert ends[-1] == pytest.approx(100 * 0.5 + 0.2)
    # alternating costs: a deep queue absorbs them (sum max / 2-ish), a queue of 1 cannot fully
    t = np.tile([0.1, 0.9], 50)
    d = np.tile([0.9, 0.1], 50)
    deep = sm.pipeline_ends(t, d, queue_size=8)[-1]
    assert deep < np.maximum(t, d).sum()
    assert deep >= max(t.sum(), d.sum())
    shallow = sm.pipeline_ends(t, d, queue_size=1)[-1]
    assert shallow >= deep


def test_packed_columns_attention_modes():
    lengths = np.array([100, 300, 600])
    seg = shp.batch_columns(lengths, [np.array([0, 1, 2])], layout="packed", attention="segment")
    dense = shp.batch_columns(lengths, [np.array([0, 1, 2])], layout="packed", attention="dense")
    assert seg["computed_tokens"][0] == 1000 and seg["sequences"][0] == 3
    assert seg["sum_len_sq"][0] == 100**2 + 300**2 + 600**2
    assert dense["sum_len_sq"][0] == 1000**2
    pad = shp.batch_columns(lengths, [np.array([0, 1, 2])], layout="padded")
    assert pad["computed_tokens"][0] == 1800 and pad["sum_len_sq"][0] == 3 * 600**2
    assert pad["useful_tokens"][0] == 1000
    assert seg["ctx_tokens"][0] == 3 * 600 and pad["ctx_tokens"][0] == pad["computed_tokens"][0]


def test_packed_grid_rows_mix_lengths_and_fill_the_row():
    parts = shp.grid_shape("packed", 4, 1000)
    assert sum(parts) == 1000 and parts == sorted(parts) and parts[0] < parts[-1]
    assert shp.grid_shape("packed", 1, 777) == [777]
    assert shp.grid_shape("padded", 3, 64) == [64, 64, 64]
    assert max(shp.grid_shape("packed", 4, 16384, max_len=4096)) <= 4096
    assert sum(shp.grid_shape("packed", 4, 16384, max_len=4096)) == 16384
    with pytest.raises(ValueError, match="profile.packed_seqs"):
        shp.grid_shape("packed", 16, 10)
    with pytest.raises(ValueError, match="data.max_len"):
        shp.grid_shape("packed", 2, 16384, max_len=4096)


def test_pipeline_with_two_target_ranks_doubles_target_supply():
    t = np.full(40, 1.0)
    d = np.full(40, 0.5)
    one = sm.pipeline_ends(t, d, queue_size=4, target_ranks=1)[-1]
    two = sm.pipeline_ends(t, d, queue_size=4, target_ranks=2)[-1]
    assert one == pytest.approx(40 * 1.0 + 0.5)
    assert two == pytest.approx(20 * 1.0 + 2 * 0.5)  # two forwards at a time; the last two steps drain


def test_pipeline_ack_wait_stalls_the_drafter_until_the_target_needs_credit():
    # target-bound (1 s forward, 0.1 s drafter), queue 2; the drafter waits for its
    # acknowledgements after every 2nd step: after step 1 it resumes only once the target
    # has computed step 1 + q = 3 (t = 4 s), so steps 2 and 3 end at 4.1 and 4.2, not 3.1, 4.1
    t, d = np.ones(4), np.full(4, 0.1)
    assert sm.pipeline_ends(t, d, queue_size=2) == pytest.approx([1.1, 2.1, 3.1, 4.1])
    assert sm.pipeline_ends(t, d, queue_size=2, ack_every=1) == pytest.approx([1.1, 2.1, 4.1, 4.2])
    # acknowledgements waited on rarely change nothing in a long steady run's rate
    t, d = np.ones(200), np.full(200, 0.5)
    slow = sm.pipeline_ends(t, d, queue_size=4, ack_every=16)
    assert slow[-1] == pytest.approx(sm.pipeline_ends(t, d, queue_size=4)[-1], abs=1.0)


def test_blended_pipeline_reaches_the_analytic_fixed_point():
    """Target-bound, steady state: the drafter works d of every target step t, so
    t = t_alone + (t_busy - t_alone) * d / t; with 1, 2 and d = 0.5: t = (1 + sqrt 3) / 2."""
    n = 300
    out = sm.blended_pipeline(np.ones(n), np.full(n, 2.0), np.full(n, 0.5), np.full(n, 0.5), queue_size=4)
    assert out["target_s"][n // 2 :] == pytest.approx(np.full(n - n // 2, (1 + 3**0.5) / 2), rel=1e-5)
    assert out["target_overlap"][n // 2] == pytest.approx(0.5 / ((1 + 3**0.5) / 2), rel=1e-4)
    assert out["drafter_overlap"][n // 2] == pytest.approx(1.0)  # the target never rests meanwhile
    assert out["drafter_overlap"][-1] == 0.0  # the last drafter step runs after every forward is done


def test_blended_pipeline_is_the_plain_pipeline_when_busy_costs_nothing_extra():
    rng = np.random.default_rng(5)
    t, d = rng.uniform(0.1, 1.0, 200), rng.uniform(0.1, 1.0, 200)
    for q, R, ack in ((1, 1, None), (2, 1, 4), (3, 2, 2)):
        out = sm.blended_pipeline(t, t, d, d, queue_size=q, target_ranks=R, ack_every=ack)
        assert np.allclose(out["end"], sm.pipeline_ends(t, d, queue_size=q, target_ranks=R, ack_every=ack))


def test_blended_step_times_stay_between_alone_and_busy():
    rng = np.random.default_rng(6)
    ta, da = rng.uniform(0.1, 1.0, 200), rng.uniform(0.1, 1.0, 200)
    tb, db = ta * rng.uniform(1.0, 2.0, 200), da * rng.uniform(1.0, 2.0, 200)
    out = sm.blended_pipeline(ta, tb, da, db, queue_size=2, target_ranks=2, ack_every=4)
    assert np.all(out["target_s"] >= ta - 1e-12) and np.all(out["target_s"] <= tb + 1e-12)
    assert np.all(out["drafter_s"] >= da - 1e-12) and np.all(out["drafter_s"] <= db + 1e-12)
    plain = sm.pipeline_ends(ta, da, queue_size=2, target_ranks=2, ack_every=4)[-1]
    busy = sm.pipeline_ends(tb, db, queue_size=2, target_ranks=2, ack_every=4)[-1]
    assert plain <= out["end"][-1] <= busy


def test_busy_share_matches_a_fine_time_grid():
    rng = np.random.default_rng(7)
    bs = np.sort(rng.uniform(0, 100, 40))
    be = bs + rng.uniform(0, 6, 40)  # overlapping busy intervals: the union counts once
    s = rng.uniform(0, 100, 30)
    e = s + rng.uniform(0, 10, 30)
    x = np.linspace(0, 120, 240_001)
    busy = np.zeros_like(x, dtype=bool)
    for a, b in zip(bs, be):
        busy |= (x >= a) & (x < b)
    dx = x[1] - x[0]
    brute = np.array([busy[(x >= a) & (x < b)].sum() * dx / (b - a) for a, b in zip(s, e)])
    got = sm.busy_share(s, e, bs, be)
    assert np.all(np.abs(got - brute) <= 3 * dx / (e - s))  # the fine grid is off by at most a step per end
    assert sm.busy_share(s, e, np.array([]), np.array([])).tolist() == [0.0] * 30


def test_cpu_share_is_cpu_over_wall_times_threads():
    assert cpu.cpu_share([1.0, 3.0], [1.0, 2.0], threads=1) == pytest.approx(0.75)
    assert cpu.cpu_share([1.0, 3.0], [4.0, 4.0], threads=4) == pytest.approx(0.5)
    assert np.isnan(cpu.cpu_share([], [], threads=1))


def test_pass_corrected_seconds_takes_the_drift_between_passes_out():
    """A machine that ran 10% slower in the later passes: the long points, timed in the first passes only
    (profile.max_point_seconds), came out fast next to the short ones under a plain median per point."""
    rng = np.random.default_rng(0)
    true = np.exp(rng.uniform(np.log(0.01), np.log(2.0), size=12))
    drift = np.array([0.92, 1.0, 1.06, 1.1, 1.1])
    noise = np.exp(rng.normal(0.0, 0.01, size=(12, 5)))
    passes = [5] * 9 + [2, 2, 3]  # the three longest points capped after their first passes
    runs = [list(true[i] * drift[:k] * noise[i, :k]) for i, k in enumerate(passes)]
    per_point, per_pass = sm.pass_corrected_seconds(runs)
    level = np.median(drift)  # the pass factors are centred on the median pass
    assert np.allclose(per_pass, drift / level, rtol=0.03)
    assert np.allclose(per_point, true * level, rtol=0.03)
    plain = np.array([np.median(r) for r in runs]) / (true * level)
    assert plain[9:].max() < 0.97 and np.allclose(plain[:9], 1.0, rtol=0.03)  # what the correction removes
    with pytest.raises(ValueError, match="at least one timed step"):
        sm.pass_corrected_seconds([[0.1, 0.2], []])
    with pytest.raises(ValueError, match="finite and > 0"):
        sm.pass_corrected_seconds([[0.1, float("nan")]])
