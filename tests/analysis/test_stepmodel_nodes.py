"""The step model across nodes: each node's pipeline, the drafters meeting once per cluster step, the measured
all-reduce as a term (lenbatch_study.analysis.stepmodel.pipeline_timeline with nodes > 1)."""

from __future__ import annotations

import numpy as np
import pytest

from lenbatch_study.analysis import stepmodel as sm


def test_drafter_bound_cluster_steps_cost_the_slowest_node_plus_the_all_reduce():
    # 2 nodes x 1 target rank, targets instant: cluster step c holds steps 2c (node 0) and 2c+1 (node 1)
    d = np.array([1.0, 3.0, 2.0, 0.5, 1.0])  # the last cluster step: node 0 alone (node 1 ran out)
    ends = sm.pipeline_ends(np.zeros(5), d, queue_size=1, target_ranks=2, nodes=2, allreduce_s=0.25)
    assert ends == pytest.approx([3.25, 3.25, 5.5, 5.5, 6.75])


def test_target_bound_nodes_run_side_by_side_and_the_all_reduce_adds_once_per_cluster_step():
    # 2 nodes x 2 target ranks, target 1 s, drafter instant: each node gets 2 batches per second, like one node
    # of 2 target ranks, and the cluster twice that; the all-reduce adds its seconds to every cluster step
    n = 40
    t, d = np.ones(n), np.zeros(n)
    one = sm.pipeline_ends(t[: n // 2], d[: n // 2], queue_size=2, target_ranks=2)
    two = sm.pipeline_ends(t, d, queue_size=2, target_ranks=4, nodes=2)
    assert two[-1] == pytest.approx(one[-1])  # twice the steps in the same time
    slow = sm.pipeline_ends(t, d, queue_size=2, target_ranks=4, nodes=2, allreduce_s=0.1)
    assert slow[-1] > two[-1]
    # steps of one cluster step end together, and no later cluster step ends before an earlier one
    tl = sm.pipeline_timeline(t, d, queue_size=2, target_ranks=4, nodes=2, allreduce_s=0.1)
    assert tl["end"][0] == tl["end"][2] and np.all(np.diff(np.sort(tl["end"])) >= 0)
    assert np.all(tl["drafter_start"] >= tl["target_end"])


def test_bad_node_counts_are_refused():
    with pytest.raises(ValueError, match="multiple of nodes"):
        sm.pipeline_ends(np.ones(4), np.ones(4), target_ranks=3, nodes=2)
