"""One rule for every public function that takes its batching as ``spec=`` or as keyword arguments: either,
never both, with one error (:func:`lenbatch.batching.spec.refuse_both`); without either, one error naming
what to pass; and the two ways give the same result. Tiny inputs: ~1 s in all (torch imported for the
sampler and collate)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import lenbatch as lb
from lenbatch.batching.boundaries import simulate_bucketed
from lenbatch.batching.simulate import simulate
from lenbatch.batching.strategies import equal_epoch_batches

X = np.random.default_rng(0).integers(5, 200, size=120)
EDGES = (0, 40, 100, 201)
KW = {"token_budget": 512, "max_batch_size": 8}
SPEC = lb.BatchSpec(**KW)
BOTH = re.escape("pass either spec= or the batching arguments, not both")
NEITHER = re.escape("pass token_budget= and max_batch_size= (or spec=lenbatch.BatchSpec(...))")


def _sampler(**kw):
    return lb.LengthBatchSampler(X, strategy="sorted", rank=0, world_size=1, **kw)


def _collate(**kw):
    from lenbatch.loading.collate import collate

    return collate([{"input_ids": [1, 2, 3]}, {"input_ids": [4, 5]}], **kw)


# name -> (call with spec=SPEC and extra keywords, call with the keywords alone (None: takes no keywords))
CALLS = {
    "plan_epoch": lambda **kw: lb.plan_epoch(X, strategy="sorted", rank=0, world_size=1, **kw),
    "plan_epoch_all": lambda **kw: lb.plan_epoch_all(X, strategy="sorted", **kw),
    "equal_epoch_batches": lambda **kw: equal_epoch_batches(X, epochs=2, strategy="sorted", **kw),
    "LengthBatchSampler": _sampler,
    "optimize_boundaries": lambda **kw: lb.optimize_boundaries(X, 2, num_candidates=16, **kw),
    "sweep_num_buckets": lambda **kw: lb.sweep_num_buckets(X, 2, num_candidates=16, **kw),
    "simulate_bucketed": lambda **kw: simulate_bucketed(X, EDGES, **kw),
    "simulate": lambda **kw: simulate(X, strategies=("sorted", "random"), epochs=2, **kw),
}


@pytest.mark.parametrize(
    "name, extra",
    [
        (n, e)
        for n in CALLS
        for e in ({"token_budget": 512}, {"seed": 3}, {"max_batch_size": 4})
        if not (n == "optimize_boundaries" and "seed" in e)
    ],
)  # takes no seed
def test_spec_and_a_keyword_is_the_one_error(name, extra):
    with pytest.raises(ValueError, match=BOTH):
        CALLS[name](spec=SPEC, **extra)


@pytest.mark.parametrize("name", CALLS)
def test_neither_is_the_one_error_and_both_ways_agree(name):
    with pytest.raises(ValueError, match=NEITHER):
        CALLS[name]()
    with pytest.raises(ValueError, match=NEITHER):
        CALLS[name](token_budget=512)
    a, b = CALLS[name](spec=SPEC), CALLS[name](**KW)
    if name == "LengthBatchSampler":
        a, b = list(a), list(b)
    elif name == "plan_epoch":
        a, b = [x.tolist() for x in a], [x.tolist() for x in b]
    elif name == "plan_epoch_all":
        a, b = ([[x.tolist() for x in rank] for rank in plans] for plans in (a, b))
    elif name == "optimize_boundaries":
        a, b = (a.edges, a.predicted_efficiency), (b.edges, b.predicted_efficiency)
    elif name == "simulate":
        a, b = ({s: {k: v for k, v in r.items() if k != "plan_seconds"} for s, r in x.items()} for x in (a, b))
    assert a == b


def test_a_keyword_at_its_default_beside_a_spec_is_no_conflict():
    """seed=0, packed_window=8, min_batches=0 are the signatures' defaults: passing them with a spec is the spec."""
    assert [
        p.tolist()
        for p in lb.plan_epoch(X, strategy="sorted", spec=SPEC, seed=0, packed_window=8, rank=0, world_size=1)
    ] == [p.tolist() for p in lb.plan_epoch(X, strategy="sorted", spec=SPEC, rank=0, world_size=1)]
    with pytest.raises(ValueError, match="spec must be a lenbatch.BatchSpec, got dict"):
        lb.plan_epoch(X, strategy="sorted", spec=dict(KW))


def test_collate_follows_the_same_rule():
    with pytest.raises(ValueError, match=BOTH):
        _collate(spec=SPEC, layout="padded", token_budget=512)
    with pytest.raises(ValueError, match="unknown batch layout None; pass layout="):
        _collate(spec=SPEC)  # the layout is the strategy's, never the spec's
    assert (
        _collate(spec=SPEC, layout="padded").input_ids.tolist()
        == _collate(layout=lb.Strategy("sorted"), token_budget=512, max_batch_size=8).input_ids.tolist()
    )


# --------------------------------------------------------------------------- the strategy owns name, edges, layout


def test_a_spec_holds_limits_and_randomness_only():
    import dataclasses

    assert [f.name for f in dataclasses.fields(lb.BatchSpec)] == [
        "token_budget",
        "max_batch_size",
        "seed",
        "packed_window",
        "min_batches",
    ]
    with pytest.raises(TypeError):
        lb.BatchSpec(**KW, edges=EDGES)  # "bucketed with these edges" is said by the Strategy alone
    assert lb.Strategy("bucketed", EDGES).layout == "padded" and lb.Strategy("packed").packed


def test_a_name_with_edges_beside_it_is_the_strategy():
    named = lb.plan_epoch(X, strategy="bucketed", edges=EDGES, rank=0, world_size=1, **KW)
    whole = lb.plan_epoch(X, strategy=lb.Strategy("bucketed", EDGES), rank=0, world_size=1, spec=SPEC)
    assert [p.tolist() for p in named] == [p.tolist() for p in whole]
    a = lb.LengthBatchSampler(X, strategy="bucketed", edges=EDGES, rank=0, world_size=1, **KW)
    b = lb.LengthBatchSampler(X, strategy=lb.Strategy("bucketed", EDGES), rank=0, world_size=1, spec=SPEC)
    assert a.fingerprint == b.fingerprint and a.edges == b.edges == EDGES and a.layout == "padded"


@pytest.mark.parametrize(
    "call",
    [
        lambda: lb.plan_epoch(X, strategy=lb.Strategy("bucketed", EDGES), edges=EDGES, rank=0, world_size=1, **KW),
        lambda: lb.plan_epoch_all(X, strategy=lb.Strategy("bucketed", EDGES), edges=EDGES, spec=SPEC),
        lambda: _sampler_of(lb.Strategy("bucketed", EDGES), edges=EDGES),
    ],
)
def test_edges_in_a_strategy_and_as_edges_is_refused_naming_the_fix(call):
    with pytest.raises(
        ValueError, match="carries its own edges and edges= was given too; pass the edges once: drop edges="
    ):
        call()


def _sampler_of(strategy, **kw):
    return lb.LengthBatchSampler(X, strategy=strategy, rank=0, world_size=1, spec=SPEC, **kw)


def test_edges_for_a_strategy_without_edges_and_bucketed_without_are_refused():
    with pytest.raises(ValueError, match="edges are only used by strategy 'bucketed', not 'sorted'"):
        lb.plan_epoch(X, strategy="sorted", edges=EDGES, rank=0, world_size=1, spec=SPEC)
    with pytest.raises(ValueError, match="strategy 'bucketed' needs edges"):
        lb.plan_epoch(X, strategy="bucketed", rank=0, world_size=1, spec=SPEC)
    with pytest.raises(ValueError, match=r"edges \[0, 40, 100\] do not cover the lengths"):
        lb.plan_epoch(X, strategy=lb.Strategy("bucketed", (0, 40, 100)), rank=0, world_size=1, spec=SPEC)


def test_fits_and_cost_take_the_layout():
    assert SPEC.fits(8, 64, layout="padded") and not SPEC.fits(8, 65, layout="padded")
    assert SPEC.fits(8, 512, layout=lb.Strategy("packed")) and not SPEC.fits(9, 10, layout="packed")
    assert SPEC.cost([3, 5], layout="padded") == 10 and SPEC.cost([3, 5], layout="packed") == 8
    with pytest.raises(ValueError, match="layout 'rows' unknown"):
        SPEC.fits(1, 1, layout="rows")


# Digests of the sampler's fingerprint before the spec lost its edges and layout (commit e90e132): saved
# sampler states carry them, so the same strategy, edges and limits must give these bytes forever.
SAVED_FINGERPRINTS = {
    ("bucketed", (0, 40, 80, 200), 0): "22576e583dea2f95",
    ("packed", None, 0): "c3bb2b816549c070",
    ("sorted", None, 7): "a7276402ab3354d9",
}


@pytest.mark.parametrize("key", SAVED_FINGERPRINTS)
def test_the_fingerprint_of_saved_states_is_unchanged(key):
    strategy, edges, min_batches = key
    x = np.arange(1, 301) % 97 + 3
    s = lb.LengthBatchSampler(
        x,
        strategy=strategy,
        edges=edges,
        token_budget=512,
        max_batch_size=8,
        seed=3,
        min_batches=min_batches,
        rank=0,
        world_size=1,
    )
    assert s.fingerprint == SAVED_FINGERPRINTS[key]
    spec = lb.BatchSpec(token_budget=512, max_batch_size=8, seed=3, min_batches=min_batches)
    assert spec.fingerprint(x, lb.Strategy(strategy, edges)) == SAVED_FINGERPRINTS[key]
