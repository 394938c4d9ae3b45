"""Fresh clones agree (issue 19.4): in a real `git clone` of the finished tiny run (conftest.py), `make run`
reruns only tokenize (the dataset is not in git; every byte it writes is the committed one, so DVC skips
everything downstream), and afterwards `dvc status` and `snakemake -n` both name nothing; after a
`git checkout` of another commit, `dvc checkout` and `make sync` they agree again; a plain `snakemake` on
a fresh clone, after `lenbatch sync`, plans what `dvc repro` would run and what follows it (Snakemake
assumes a rerun job changes its outputs), not profile; and DVC's own `dvc plots show` renders offline there.
Reuses the one finished run (conftest.py); about 50 s of its own on a quiet 2-core machine (two clones,
tokenize once, stats and compare once, three syncs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from _e2e import git_commit, make
from test_workflow import run
from test_workflow_e2e import dry_run_stages, dvc_changed, dvc_downstream

# one worker builds and uses the shared finished run (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("finished")]


def _git_status(work: Path) -> str:
    return run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=work).stdout


@pytest.fixture(scope="module")
def clone(finished, tmp_path_factory):
    """`git clone` of the finished run (no dataset, no .snakemake/), then `make run` in it (~20 s)."""
    work = tmp_path_factory.mktemp("clone") / "repo"
    run(["git", "clone", "-q", str(finished), str(work)])
    for args in (["git", "config", "user.email", "ci@lenbatch"], ["git", "config", "user.name", "lenbatch ci"]):
        run(args, cwd=work)
    assert not (work / "results/tokenize/dataset").exists() and not (work / ".snakemake").exists()
    out = make(work, "run")
    return work, out.stdout + out.stderr


def test_make_run_in_a_fresh_clone_reruns_only_tokenize_and_both_tools_agree(clone):
    work, out = clone
    ran = set(re.findall(r"Running stage '([\w-]+)'", out))
    skipped = set(re.findall(r"Stage '([\w-]+)' didn't change, skipping", out))
    assert ran == {"tokenize"}, out
    assert {"stats", "boundaries", "plans", "profile", "train-packed", "quality", "compare"} <= skipped, out
    assert dvc_changed(work) == set(), run(["dvc", "status"], cwd=work).stdout
    assert dry_run_stages(work) == set(), run(["snakemake", "-n"], cwd=work).stdout
    assert _git_status(work) == ""  # tokenize rewrote lengths.npy, stats.json, params.json: the same bytes


def test_dvc_plots_show_renders_offline_in_a_fresh_clone(clone, tmp_path):
    """The command DVC users type, with the template `.dvc/config` names (written by make install)."""
    work, _ = clone
    run(["dvc", "plots", "show", "-o", str(tmp_path / "show")], cwd=work)
    page = (tmp_path / "show" / "index.html").read_text()
    head = page.split("</head>", 1)[0]
    assert "<script src=" not in page and "cdn.jsdelivr" not in page  # nothing to fetch
    assert "vegaEmbed" in head and "vegaLite" in head  # the libraries inlined, before the plots use them
    assert "frontier.json" in page and "throughput.json" in page and "var spec = " in page


def test_checkout_of_another_commit_then_dvc_checkout_and_sync_agree(clone):
    """A second commit (other histogram bins: DVC reruns stats and compare, which draws the histogram), then
    `git checkout` of the first, `dvc checkout` and `make sync`: both tools name nothing, and the files are
    the first commit's. (Without the sync, `snakemake -n` plans stats and compare: its records hold the
    second commit's params.)"""
    work, _ = clone
    params = work / "params.yaml"
    text = params.read_text()
    assert "histogram_bins: 64" in text
    params.write_text(text.replace("histogram_bins: 64", "histogram_bins: 16"))
    out = run(["dvc", "repro"], cwd=work)
    ran = set(re.findall(r"Running stage '([\w-]+)'", out.stdout + out.stderr))
    assert "stats" in ran and ran <= {"stats", "compare"}, ran
    git_commit(work, "16 histogram bins")
    run(["git", "checkout", "-q", "HEAD~1"], cwd=work)
    run(["dvc", "checkout"], cwd=work)
    make(work, "sync")
    assert dvc_changed(work) == set()
    assert dry_run_stages(work) == set(), run(["snakemake", "-n"], cwd=work).stdout
    assert _git_status(work) == "" and params.read_text() == text


def test_plain_snakemake_on_a_fresh_clone_plans_what_dvc_would_and_its_downstream(finished, tmp_path):
    """Without `make run`: `dvc status` names tokenize (the dataset is not in git) and the stages reading the
    dataset. Snakemake plans tokenize and everything downstream of it (it assumes a rerun changes its outputs:
    the README names `make run` instead) and, with no records of its own, profile too (the checkout's file
    times; measured: every stage). After `lenbatch sync` its plan is exactly DVC's stages and their downstream."""
    work = tmp_path / "repo"
    run(["git", "clone", "-q", str(finished), str(work)])
    changed = dvc_changed(work)
    assert "tokenize" in changed and "profile" not in changed and "stats" not in changed
    downstream = dvc_downstream(work, changed)
    assert "profile" not in downstream and {"stats", "boundaries", "plans"} <= downstream
    run(["lenbatch", "sync"], cwd=work)
    assert dry_run_stages(work) == downstream
