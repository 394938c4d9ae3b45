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


# `make test` runs the suite on two pytest-xdist workers, by file (--dist loadfile): the tests that share
# the one finished workflow run (tests/pipeline/conftest.py, ~90 s to build) are one file, so it is built
# once. (--dist loadgroup would group across files, but pytest 9.2 no longer lets xdist 3.8 rename the
# test ids it groups by.) The longest files go first so that no worker is left with a long tail.
FIRST = ("tests/pipeline/test_workflow_e2e.py", "tests/benchmarks/test_gpu_check.py",
         "tests/runtime/test_transport.py")


def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(FIRST)

    items.sort(key=rank)  # stable: collection order within each rank
