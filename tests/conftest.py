"""Shared fixtures."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on tiny shapes a second thread only adds OpenMP barriers (and stalls on a busy CI box)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# `make test` runs the suite on two workers (pytest-xdist, --dist loadgroup). The tests that share the one
# finished workflow run (tests/pipeline/conftest.py, ~90 s to build) form one group on one worker, so it is
# built once; the longest groups go first so that no worker is left with a long tail (on 2 cores: the
# finished-run group ~9 min, the GPU check's rehearsal ~4 min, everything else spread around them).
FIRST = ("tests/pipeline/test_fresh_clone.py", "tests/pipeline/test_workflow_e2e.py",
         "tests/benchmarks/test_gpu_check.py::test_rehearsal")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(FIRST)

    items.sort(key=rank)  # stable: collection order within each rank
