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


@pytest.mark.parametrize("name, extra", [(n, e) for n in CALLS for e in ({"token_budget": 512}, {"seed": 3},
                                                                          {"max_batch_size": 4})
                                         if not (n == "optimize_boundaries" and "seed" in e)])  # takes no seed
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
    assert [p.tolist() for p in lb.plan_epoch(X, strategy="sorted", spec=SPEC, seed=0, packed_window=8, rank=0,
                                              world_size=1)] == \
        [p.tolist() for p in lb.plan_epoch(X, strategy="sorted", spec=SPEC, rank=0, world_size=1)]
    with pytest.raises(ValueError, match="spec must be a lenbatch.BatchSpec, got dict"):
        lb.plan_epoch(X, strategy="sorted", spec=dict(KW))


def test_collate_follows_the_same_rule():
    with pytest.raises(ValueError, match=BOTH):
        _collate(spec=SPEC, layout="padded")
    assert _collate(spec=SPEC).input_ids.tolist() == _collate(layout="padded", token_budget=512,
                                                              max_batch_size=8).input_ids.tolist()
