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
# test ids it groups by.) The files go out longest first, so that no worker is left with a long tail at
# the end (longest-processing-time first: each worker takes the next file when it is nearly done).
# FIRST is that order for the files above ~20 s, from the per-file seconds of a fresh-clone CI run (junit
# times summed per file); the rest follow in collection order. xdist would reorder the files by their
# number of tests (its default --loadscope-reorder), which put the 5-minute GPU-check rehearsal (9 tests)
# twelve minutes into the suite; pytest_configure turns that off.
FIRST = (
    "tests/pipeline/test_workflow_e2e.py",
    "tests/slurm/test_slurm_check.py",
    "tests/benchmarks/test_gpu_check.py",
    "tests/stages/test_train_signal.py",
    "tests/stages/test_train.py",
    "tests/models/test_fla_cpu.py",
    "tests/runtime/test_transport.py",
    "tests/pipeline/test_experiments_e2e.py",
    "tests/pipeline/test_settings_e2e.py",
    "tests/pipeline/test_data_source_e2e.py",
    "tests/stages/test_train_nodes.py",
    "tests/pipeline/test_failure_edges.py",
    "tests/loading/test_accelerate.py",
    "tests/loading/test_lightning.py",
    "tests/pipeline/test_workflow.py",
    "tests/loading/test_hf.py",
    "tests/stages/test_data_stage.py",
    "tests/loading/test_readme_trainer.py",
    "tests/models/test_gpu_path.py",
    "tests/loading/test_trl.py",
    "tests/stages/test_profile.py",
    "tests/stages/test_compare.py",
)


def pytest_configure(config):
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist present
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        for i, prefix in enumerate(FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(FIRST)

    items.sort(key=rank)  # stable: collection order within each rank
