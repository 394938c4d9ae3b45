"""The whole DAG for real, on configs/tiny.yaml merged into params.yaml: `make run` (dvc repro, then
snakemake --touch; the `finished` fixture of conftest.py) drives Snakemake through every stage (real tokenizer,
real data, real torchrun) and leaves both tools agreeing; a code edit or any params key makes `snakemake -n` and `dvc status` name the same stages;
`dvc exp run --temp` reruns only what K touches and the experiment diffs in a few columns; a
--configfile run keeps to its own results root; deleting a strategy's results rebuilds it; an
interrupted run stops promptly and resumes without redoing finished outputs; another machine's fingerprint
reruns the measuring stages in both tools. Fresh clones agree (at the end of this file).

All of it in one file: `make test` distributes tests by file (pytest-xdist --dist loadfile), so the one
finished run is built once, by the one worker that runs these tests."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from lenbatch_study.tools.reruns import reruns
from test_reruns import dvc_stages
from _e2e import changed_stages, git_commit, make, resolve_stage
from _procs import descendants, running
from _runs import check_pipelined_run, planned_hashes
from test_workflow import BIN, ENV, ROOT, job_counts, run

pytestmark = pytest.mark.slow


def dry_run_stages(work: Path, *extra: str, snakemake: tuple[str, ...] = ("snakemake",)) -> set[str]:
    """Jobs `snakemake -n` would run, named as DVC names its stages (train@<strategy>)."""
    out = run([*snakemake, "-n", *extra], cwd=work).stdout
    stages = set()
    for block in re.split(r"\n(?=rule \w+:)", out):
        m = re.match(r"rule (\w+):", block)
        if m and m.group(1) != "all":
            wc = re.search(r"wildcards: strategy=(\w+)", block)
            stages.add(f"{m.group(1)}@{wc.group(1)}" if wc else m.group(1))
    return stages


def dvc_changed(work: Path) -> set[str]:
    status = json.loads(run(["dvc", "status", "--json"], cwd=work).stdout or "{}")
    return set(changed_stages(status))  # "machine: always changed" is no change


def dvc_stage_table(work: Path) -> dict[str, dict]:
    """dvc.yaml's stages as DVC resolves them for this params.yaml: the foreach over train.strategies
    expanded to train@<strategy>."""
    doc = yaml.safe_load((work / "dvc.yaml").read_text())
    names = run(["dvc", "stage", "list", "--name-only"], cwd=work).stdout.split()
    return {name: resolve_stage(doc, name) for name in names}


def dvc_downstream(work: Path, changed: set[str]) -> set[str]:
    """``changed`` and every stage downstream of it in dvc.yaml (an output of one is a dep of the next):
    what `dvc repro` runs when each rerun stage rewrites its outputs (Snakemake always assumes so)."""
    stages = dvc_stage_table(work)
    outs = {
        name: {
            next(iter(o)) if isinstance(o, dict) else o
            for kind in ("outs", "metrics", "plots")
            for o in st.get(kind, [])
        }
        for name, st in stages.items()
    }

    def feeds(paths: set[str], deps: list[str]) -> bool:
        # a dep is an output, a folder holding one (compare: results/train), or a file inside an output
        # folder; of boundaries' by-strategy/ files only bucketed's bytes ever change (the others' are constant)
        deps = [d for d in deps if "/by-strategy/" not in d or d.endswith("/bucketed.json")]
        return any(p == d or p.startswith(d + "/") or d.startswith(p + "/") for p in paths for d in deps)

    found, todo = set(changed), list(changed)
    while todo:
        up = todo.pop()
        for name, st in stages.items():
            if name not in found and feeds(outs[up], st.get("deps", [])):
                found.add(name)
                todo.append(name)
    return found


def test_every_stage_wrote_its_outputs(finished):
    strategies = yaml.safe_load((finished / "params.yaml").read_text())["train"]["strategies"]
    for path in (
        "results/tokenize/lengths.npy",
        "results/stats/stats.json",
        "results/boundaries/sweep.json",
        "results/plans/metrics.json",
        "results/profile/grid.json",
        "results/compare/report.md",
        "results/compare/quality.png",
        "results/quality/quality.json",
    ):
        assert (finished / path).stat().st_size > 0, path
    for strategy in strategies:
        summary = json.loads((finished / f"results/train/{strategy}/summary.json").read_text())
        assert summary["useful_tokens_per_s"] > 0
    metrics = json.loads((finished / "results/compare/metrics.json").read_text())
    for strategy in strategies:
        assert any(key.startswith(strategy) for key in metrics), f"{strategy} missing from compare metrics"
    report = (finished / "results/compare/report.md").read_text()
    assert all(s in report for s in strategies)
    # the quality section and its plot are compare's: the finding in a sentence in report.md, the tables in details.md
    assert "## Does composition change what is learned?" in report
    assert "![quality](quality.png)" in (finished / "results/compare/details.md").read_text()
    assert (
        not (finished / "results/quality/report.md").exists()
        and not (finished / "results/quality/quality.png").exists()
    )
    assert (finished / "logs/tokenize.log").exists() and (finished / "logs/benchmarks/train/packed.tsv").exists()


def test_every_training_ran_pipelined_and_trained_exactly_its_planned_batches(finished):
    """The workflow's five torchrun runs (1 target rank -> 1 drafter rank; tests/stages/test_train.py runs
    sorted and random outside the workflow): the drafter trained the planned batches in order, within the
    budget, stopping at train.useful_tokens; the summary agrees with the steps; the machine and the
    reference step are recorded; compare's reader takes the run."""
    from lenbatch_study.core import machine
    from lenbatch_study.core.config import load_params
    from lenbatch_study.pipeline.artifacts import train_runs
    from lenbatch_study.runtime import reference

    lengths = np.load(finished / "results/tokenize/lengths.npy")
    edges = json.loads((finished / "results/boundaries/boundaries.json").read_text())["edges"]
    for strategy in load_params(finished / "params.yaml").train.strategies:
        out = finished / "results/train" / strategy
        params = load_params(out / "params.json")  # the run's own (later tests here may rerun one)
        assert params.train.nproc == 2
        steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
        summary = json.loads((out / "summary.json").read_text())
        check_pipelined_run(
            steps,
            summary,
            strategy=strategy,
            token_budget=params.batching.token_budget,
            useful_tokens=params.train.useful_tokens,
            warmup_steps=params.train.warmup_steps,
            planned=planned_hashes(lengths, params, strategy, edges, steps),
        )
        assert summary["machine"]["id"] == machine.fingerprint()["id"]
        ref = summary["reference"]
        assert ref["shape"] == reference.reference_shape(params)
        for role in ("target", "drafter"):  # target rank 0's and the drafter rank's, before and after the steps
            assert len(ref[role]["start"]) == len(ref[role]["end"]) == reference.REPEATS
            assert min(ref[role]["start"] + ref[role]["end"]) > 0
        assert train_runs.read_run(finished / "results/train", strategy) == {"summary": summary, "steps": steps}


def test_the_profile_timed_each_role_alone_and_busy_in_two_processes(finished):
    """profile.concurrent (train.nproc 2): every grid point timed alone and while the other role steps, in
    two role workers; the reference step of both roles; compare's readers take the grid (the one-process
    profile: tests/stages/test_profile.py)."""
    from lenbatch_study.core import machine
    from lenbatch_study.core.config import load_params
    from lenbatch_study.core.cpu import grid_cpu_share
    from lenbatch_study.pipeline.artifacts import profile_grid
    from lenbatch_study.runtime import reference
    from lenbatch_study.stages.profile import grid_points

    params = load_params(finished / "params.yaml")
    assert params.profile.concurrent and params.train.nproc == 2
    out = finished / "results/profile"
    grid = json.loads((out / "grid.json").read_text())
    rows = grid["points"]
    assert grid["machine"]["id"] == machine.fingerprint()["id"]
    ref = grid["reference"]
    assert ref["shape"] == reference.reference_shape(params)
    for role in ("target", "drafter"):
        assert len(ref[role]["start"]) == len(ref[role]["end"]) == reference.REPEATS
    assert [(r["layout"], r["sequences"], r["length"]) for r in rows] == grid_points(params)
    n = params.profile.repeats
    for r in rows:
        for role in ("target", "drafter"):
            assert len(r[f"{role}_seconds_all"]) == len(r[f"{role}_busy_seconds_all"]) == n
            assert len(r[f"{role}_busy_cpu_seconds_all"]) == n
            assert all(x > 0 for x in r[f"{role}_seconds_all"] + r[f"{role}_busy_seconds_all"])
            assert r[f"{role}_busy_seconds_median"] == pytest.approx(float(np.median(r[f"{role}_busy_seconds_all"])))
        assert 0 < r["positions"] <= r["sequences"] * params.drafter.anchors_per_seq * (params.drafter.block_size - 1)
        # the features' transport between the two roles, as the trainings move them (gloo on CPU)
        assert len(r["transport_seconds_all"]) == n and r["transport_bytes"] > 0 and r["transport_backend"] == "gloo"
    share = grid_cpu_share(rows, threads=params.train.threads)
    assert 0 < share["target"] < 1.5 and 0 < share["drafter"] < 1.5
    assert profile_grid.read_grid(out) == rows


def test_both_tools_agree_after_make_run(finished):
    assert dvc_changed(finished) == set(), run(["dvc", "status"], cwd=finished).stdout
    assert "Nothing to be done" in run(["snakemake", "-n"], cwd=finished).stdout


def test_another_machine_reruns_the_measuring_stages_in_both_tools(finished):
    """The machine fingerprint is a dependency (issue 19): a Python with other library versions (the fla venv:
    flash-linear-attention and another triton) is another machine; after `lenbatch machine` there (what
    `dvc repro` runs first) `dvc status` names profile, every training, quality and interleave, and
    `snakemake -n` run by that Python (which writes the fingerprint as it parses) plans those and compare.
    The same machine: nothing."""
    other = ROOT / ".venv-fla" / "bin" / "python"
    if not other.exists():
        pytest.skip(f"{other} is absent (make .venv-fla/.lenbatch-fla-installed builds it; make test does)")
    path = finished / "results/machine/machine.json"
    saved, st = path.read_bytes(), path.stat()
    strategies = yaml.safe_load((finished / "params.yaml").read_text())["train"]["strategies"]
    measuring = {"profile", "quality", "interleave", *(f"train@{s}" for s in strategies)}
    try:
        run([str(other), "-m", "lenbatch_study", "machine", "--out", "results/machine"], cwd=finished)
        assert path.read_bytes() != saved
        assert dvc_changed(finished) == measuring | {"machine"}  # its output differs from dvc.lock's
        assert dry_run_stages(finished, snakemake=(str(other), "-m", "snakemake")) == measuring | {"compare"}
    finally:
        path.write_bytes(saved)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    run(["lenbatch", "machine", "--out", "results/machine"], cwd=finished)  # this machine: the file is left as it is
    assert path.read_bytes() == saved and path.stat().st_mtime_ns == st.st_mtime_ns
    assert dvc_changed(finished) == set() and dry_run_stages(finished) == set()


# A sample (each ~6 s): one module per layer that reruns something different, and a key of every section
# whose reruns differ; test_reruns checks the whole module table by structure, test_workflow the params keys.
@pytest.mark.parametrize(
    "edit",
    [
        "code:lenbatch_study/corpus/chat.py",
        "code:lenbatch_study/cli/flags.py",
        "code:lenbatch/loading/collate.py",
        "code:lenbatch_study/analysis/stepmodel.py",
        "code:lenbatch/batching/strategies.py",
        "code:lenbatch_study/pipeline/registry.py",
        "train.warmup_steps=2",
        "train.reuse_host_memory=false",
        "boundaries.num_buckets=2",
        "data.max_len=1000",
        "profile.repeats=2",
        "drafter.lr=0.001",
        "stats.histogram_bins=32",
    ],
)
def test_snakemake_and_dvc_name_the_same_stages(finished, edit):
    """For a code edit and for params keys of every section, `snakemake -n` and `dvc status` name the same
    stages: Snakemake's jobs are the stages `dvc status` names plus those downstream of them (Snakemake
    reports only the first reason per job, so its list is compared with DVC's after propagation). For a
    code edit, the stages `dvc status` names are those `lenbatch reruns` derives: the derivation holds on a real edit."""
    params = finished / "params.yaml"
    original = params.read_text()
    kind, _, what = edit.partition(":")
    if kind == "code":
        path = finished / "src" / what  # lenbatch/... (the library) or lenbatch_study/... (the study)
        saved, st = path.read_text(), path.stat()
        path.write_text(saved + "\n# edited\n")
    else:
        key, _, value = edit.partition("=")
        section, name = key.split(".")
        doc = yaml.safe_load(original)
        doc[section][name] = yaml.safe_load(value)
        params.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        smk, changed = dry_run_stages(finished), dvc_changed(finished)
        dvc = dvc_downstream(finished, changed)
    finally:
        params.write_text(original)
        if kind == "code":  # its bytes and its file time: a later test must not see a code file newer than it was
            path.write_text(saved)
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    if kind == "code":
        strategies = yaml.safe_load(original)["train"]["strategies"]
        assert changed == dvc_stages(reruns()[what], strategies), f"{edit}: dvc status {sorted(changed)}"
        assert smk == dvc_downstream(finished, dvc_stages(reruns()[what], strategies)), f"{edit}: snakemake -n {smk}"
    if edit in ("code:lenbatch_study/cli/flags.py", "code:lenbatch_study/pipeline/registry.py"):  # no code dep
        assert smk == dvc == set(), (smk, dvc)
        return
    if edit in (
        "code:lenbatch_study/analysis/stepmodel.py",
        "code:lenbatch_study/analysis/report.py",
        "code:lenbatch_study/analysis/quality_report.py",
    ):
        assert smk == dvc == {"compare"}, (smk, dvc)  # the prediction fit and the reports rerun no measurement
    assert smk, f"{edit}: snakemake plans nothing"
    assert smk == dvc, f"{edit}: snakemake -n {sorted(smk)} but dvc status {sorted(dvc)}"
    if edit.startswith(("train.warmup_steps", "train.queue_size", "train.checkpoint_every")):
        assert "profile" not in smk  # profile never reads them
    if edit.startswith("boundaries.num_buckets"):
        # quality trains every strategy and interleave times every one, bucketed included: the edges rerun both
        assert changed == {"boundaries", "compare"} and smk == {
            "boundaries",
            "plans",
            "train@bucketed",
            "quality",
            "interleave",
            "compare",
        }


def test_temp_experiment_reruns_only_what_k_touches(finished):
    """`dvc exp run --temp` (what --queue uses): the dataset comes from DVC's cache, the other results
    from git, so a K change reruns boundaries, plans, train-bucketed, quality (it trains bucketed too),
    interleave (it times bucketed too) and compare only. `dvc exp show --only-changed` then shows of the
    headline only bucketed's numbers, the recommendation and the interleaved ratios and intervals of every
    strategy but sorted, which the one interleave job measures again beside bucketed's (the machine's
    drift cancels only between steps timed in turns, so no ratio is kept from an earlier job): no other
    strategy's training numbers, and at most 34 columns in all."""
    t0 = time.time()
    out = run(["dvc", "exp", "run", "--temp", "-n", "k2", "-S", "boundaries.num_buckets=2"], cwd=finished, timeout=900)
    text = out.stdout + out.stderr
    ran = set(re.findall(r"Running stage '([\w@-]+)'", text))
    assert ran == {"machine", "source", "boundaries", "plans", "train@bucketed", "quality", "interleave", "compare"}, (
        text
    )
    shown = run(["dvc", "exp", "show", "--only-changed", "--csv"], cwd=finished).stdout
    columns = next(csv.reader(io.StringIO(shown)))
    print(f"\n--temp K experiment: {time.time() - t0:.0f} s; exp show --only-changed: {len(columns)} columns")
    print(run(["dvc", "exp", "show", "--only-changed", "--md"], cwd=finished).stdout)
    headline = set(json.loads((finished / "results/compare/metrics.json").read_text()))
    shown_metrics = [c for c in columns if c in headline]
    assert shown_metrics and all(
        c.startswith(("bucketed.", "recommended.", "verdict")) or ".interleaved." in c for c in shown_metrics
    ), shown_metrics
    # Experiment, rev, typ, Created; bucketed's 5 headline numbers; 4 x 4 interleaved; the verdict and the
    # recommendation's 2; the param; the changed dependencies' hashes (~6)
    assert len(columns) <= 4 + 5 + 16 + 3 + 1 + 6, columns
    diff = json.loads(run(["dvc", "metrics", "diff", "--json", "HEAD", "k2"], cwd=finished).stdout)
    changed = diff["results/compare/metrics.json"]
    assert any(k.startswith("bucketed.") for k in changed) and not any(k.startswith("sorted.") for k in changed)
    # the workspace itself is untouched by a --temp experiment
    assert dvc_changed(finished) == set()


def test_plots_are_registered_and_render_offline(finished, tmp_path):
    """frontier and throughput (data and PNG) are DVC plots; `lenbatch plots` renders them with Vega
    inlined (no CDN), and `dvc plots show` puts the PNGs in as images."""
    out = tmp_path / "plots"
    run(["dvc", "plots", "show", "-o", str(out)], cwd=finished)
    html = (out / "index.html").read_text()
    for name in ("frontier.png", "throughput.png", "frontier.json", "throughput.json"):
        assert name in html, name
    offline = tmp_path / "offline"
    run([str(BIN / "lenbatch"), "plots", "--out", str(offline)], cwd=finished)
    page = (offline / "index.html").read_text()
    assert "cdn.jsdelivr" not in page and "<script src=" not in page  # nothing to fetch
    assert "vegaEmbed(" in page and "function vegaEmbed" in page or "vegaEmbed" in page.split("</head>")[0]
    assert "frontier.json" in page and "throughput.json" in page and "frontier.png" in page
    if shutil.which("node"):  # render each Vega spec of the page to SVG with the inlined libraries, offline
        _render_specs_with_node(page, tmp_path / "node")


RENDER_JS = """
const vega = require('vega'); const vl = require('vega-lite'); const specs = require('./specs.json');
(async () => { for (const s of specs) {
  const vg = (s.$schema || '').includes('vega-lite') ? vl.compile(s).spec : s;
  const svg = await new vega.View(vega.parse(vg), {renderer: 'none'}).toSVG();
  console.log((svg.match(/<path|<circle|<rect|<line/g) || []).length);
} })().catch(e => { console.error(e); process.exit(1); });
"""


def _render_specs_with_node(page: str, where: Path) -> None:
    from lenbatch_study.tools.plots import _assets

    body = page.rsplit("</head>", 1)[1]
    specs = [json.loads(s) for s in re.findall(r"var spec = (\{.*?\});\s*vegaEmbed", body, re.S)]
    assert len(specs) >= 3, "expected the frontier, throughput and histogram Vega plots"
    for lib in ("vega", "vega-lite"):
        (where / "node_modules" / lib).mkdir(parents=True)
        shutil.copy2(_assets() / lib / f"{lib}.js", where / "node_modules" / lib / "index.js")
    (where / "specs.json").write_text(json.dumps(specs))
    (where / "render.js").write_text(RENDER_JS)
    marks = subprocess.run(["node", "render.js"], cwd=where, capture_output=True, text=True, timeout=120, check=True)
    counts = [int(n) for n in marks.stdout.split()]
    assert len(counts) == len(specs) and all(n > 5 for n in counts), marks.stdout + marks.stderr


def test_configfile_runs_keep_to_their_own_results_root(finished):
    for config, root in (
        ("configs/tiny.yaml", "results/tiny/"),
        ("configs/qwen3.6-27b-8gpu.yaml", "results/qwen3.6-27b-8gpu/"),
    ):
        out = run(["snakemake", "-n", "--configfile", config], cwd=finished).stdout
        outputs = [p for line in re.findall(r"^\s+output: (.*)$", out, re.M) for p in line.split(", ")]
        assert outputs and all(p.startswith(root) for p in outputs), [p for p in outputs if not p.startswith(root)]


def test_deleting_a_strategy_rebuilds_it(finished):
    shutil.move(finished / "results/train/random", finished / "random.bak")
    try:
        counts = job_counts(run(["snakemake", "-n"], cwd=finished).stdout)
        assert counts.get("train") == 1 and counts.get("compare") == 1, counts
    finally:
        shutil.move(finished / "random.bak", finished / "results/train/random")


def _start_in_a_terminal(args: list[str], *, cwd: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """``args`` as a terminal's foreground job: a new session whose controlling terminal is a fresh
    pseudo-terminal (its foreground group: this process's), its output copied to ``log`` by a thread.
    Returns the process and the terminal's master side (write b"\x03" to it: the terminal's Ctrl-C)."""
    import fcntl
    import termios
    import threading

    master, slave = os.openpty()

    def session() -> None:
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(args, cwd=cwd, env=ENV, stdin=slave, stdout=slave, stderr=slave, preexec_fn=session)
    os.close(slave)

    def copy() -> None:
        with open(log, "wb") as out:
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every process holding the terminal has closed it
                    return
                if not chunk:
                    return
                out.write(chunk)
                out.flush()

    threading.Thread(target=copy, daemon=True).start()
    return proc, master


@pytest.mark.parametrize("how", ["group", "terminal"])
def test_sigint_to_snakemake_stops_training_promptly_and_resumes(finished, tmp_path, how):
    """Ctrl-C mid-training, as a script sends it (``kill -INT -- -<pgid>``: snakemake's whole process group)
    and as a terminal's Ctrl-C (the terminal sends it to snakemake's whole foreground group): the training
    stops at a step boundary with a checkpoint (each of its processes got one SIGINT: torchrun's agent and
    workers from ``lenbatch train``, as their group is their own); snakemake returns within seconds and only
    once every process of the training has stopped, torchrun's workers included (a rerun at once finds no
    writer); the rerun resumes from that checkpoint and redoes nothing else."""
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 30000 + (how == "terminal")}}))
    args = ["snakemake", "--cores", "2", "--configfile", str(changed), "--", "results/train/sorted/summary.json"]
    lengths = finished / "results/tokenize/lengths.npy"
    before = lengths.stat().st_mtime_ns
    err = tmp_path / "snakemake.err"
    if how == "terminal":
        proc, terminal = _start_in_a_terminal(args, cwd=finished, log=err)
    else:
        with open(err, "w") as err_file:
            proc = subprocess.Popen(
                args, cwd=finished, env=ENV, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True
            )
    # mid-training: once this run's first step is logged (the workers exist and train)
    partial = finished / "results/train/.sorted.partial"
    started, deadline = time.time(), time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        steps = partial / "steps.jsonl"
        if steps.exists() and steps.stat().st_mtime > started and steps.read_text().strip():
            break
        time.sleep(0.2)
    run_pids = descendants(proc.pid)  # the training's processes, torchrun's workers included
    t0 = time.time()
    if how == "terminal":
        os.write(terminal, b"\x03")
    else:
        os.killpg(proc.pid, signal.SIGINT)  # snakemake's group: its jobs get it with it
    proc.wait(timeout=180)
    stopped = time.time() - t0
    alive = [p for p in run_pids if running(p)]  # at once: snakemake has waited for them
    print(f"\nsnakemake ({how}) stopped {stopped:.1f} s after SIGINT")
    try:
        assert proc.returncode != 0, "the run finished before it could be interrupted"
        # a training that ran to its end (SIGINT to snakemake alone, which waits for its jobs) takes ~25 s
        assert stopped < 15, f"snakemake took {stopped:.0f} s to stop after SIGINT"
        assert not alive, (
            f"processes of the interrupted run still alive when snakemake returned: {alive}\n"
            + err.read_text(errors="replace")[-3000:]
        )
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of the interrupted run still alive: {left}"
    finally:
        if how == "terminal":
            os.close(terminal)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, if anything is left
        except ProcessLookupError:
            pass
    marker = partial / "stopped.json"
    log = (finished / "logs/train/sorted.log").read_text(errors="replace")
    assert marker.exists() and "stopped on SIGINT at step" in log, f"no stop at a step boundary:\n{log[-3000:]}"
    # one SIGINT each: a second one stops a worker at once ("interrupted", its peer then loses the connection)
    # and makes torchrun's agent send its workers SIGTERM mid-shutdown
    for sign in ("lenbatch train: interrupted", "closing signal SIGTERM", "Connection closed by peer"):
        assert sign not in log, f"a process of the training got SIGINT twice ({sign!r}):\n{log[-3000:]}"
    stop = json.loads(marker.read_text())
    assert stop["signal"] == "SIGINT" and stop["step"] >= 1, stop
    run([*args[:-2], "--rerun-incomplete", *args[-2:]], cwd=finished, timeout=900)
    summary = json.loads((finished / "results/train/sorted/summary.json").read_text())
    assert summary["resumed_from_step"] == stop["step"], summary["resumed_from_step"]
    assert lengths.stat().st_mtime_ns == before, "a finished output was redone"
    assert (
        "Nothing to be done" in run(["snakemake", "-n", "--configfile", str(changed), *args[-2:]], cwd=finished).stdout
    )


# --------------------------------------------------------------------------- a failure keeps the results
# A stage that fails or is interrupted leaves its previous complete output byte for byte, under both tools:
# every declared output is update() in the rules (Snakemake neither deletes it before the job nor after a
# failure) and the stage writes a staging folder it swaps in only on success (lenbatch_study.pipeline.outputs).
# What Snakemake records for an output it restored is its own (docs/reliability.md).


def _digests(folder: Path) -> dict[str, str]:
    """sha256 of every file under ``folder`` (hidden ones included), by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_a_failing_snakemake_job_keeps_the_previous_output_and_dvc_still_knows_it(finished, tmp_path):
    """K = 500 with 23 distinct lengths: the job fails with the stage's message (exit 1) and boundaries.json and
    sweep.json keep their previous bytes (update(): Snakemake restores its backup copy). Snakemake then records
    the failed job's params for what it restored (its own behaviour; the workflow no longer rewrites its
    records): the same bad K finds nothing to do and the good K plans boundaries again, while `dvc status`,
    whose dvc.lock still holds the params that made the bytes, names nothing new. `snakemake --touch` with the
    good params (the public step docs/reliability.md gives) brings Snakemake back to agreement."""
    bad = tmp_path / "bad_k.yaml"
    bad.write_text(yaml.safe_dump({"boundaries": {"num_buckets": 500}}))
    target = ["--", "results/boundaries/boundaries.json"]
    # what both tools plan before (the shared run may hold earlier tests' changes): the failure adds nothing
    smk_before, dvc_before = dry_run_stages(finished), dvc_changed(finished)
    assert "boundaries" not in smk_before and "boundaries" not in dvc_before
    before = _digests(finished / "results/boundaries")
    proc = run(["snakemake", "--cores", "2", "--configfile", str(bad), *target], cwd=finished, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "boundaries.num_buckets=500" in out, out
    assert _digests(finished / "results/boundaries") == before
    assert "Nothing to be done" in run(["snakemake", "-n", "--configfile", str(bad), *target], cwd=finished).stdout
    assert "boundaries" in dry_run_stages(finished)
    assert dvc_changed(finished) == dvc_before
    run(["snakemake", "--touch", "--cores", "1", *target], cwd=finished)
    assert _digests(finished / "results/boundaries") == before
    assert dry_run_stages(finished) == smk_before, run(["snakemake", "-n"], cwd=finished).stdout
    assert dvc_changed(finished) == dvc_before


def test_ctrl_c_of_dvc_repro_keeps_the_previous_tokenize_output(finished):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while `dvc repro -f -s tokenize`
    runs the stage: non-zero exit, no process left, and every file of results/tokenize (the dataset
    included) has its previous bytes (before: only params.json and timings.json were left)."""
    tok = finished / "results/tokenize"
    before = _digests(tok)
    # what both tools plan before (the shared run may hold earlier tests' changes): the interruption adds nothing
    smk_before, dvc_before = dry_run_stages(finished), dvc_changed(finished)
    assert "tokenize" not in smk_before and "tokenize" not in dvc_before
    proc = subprocess.Popen(
        ["dvc", "repro", "-f", "-s", "tokenize"],
        cwd=finished,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            cmdlines = [
                Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ")
                for p in descendants(proc.pid)
                if Path(f"/proc/{p}/cmdline").exists()
            ]
            if any(b"lenbatch tokenize" in c for c in cmdlines):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "dvc repro ended before its tokenize stage started"
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=120)
        assert proc.returncode != 0
        time.sleep(1)
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of the interrupted run still alive: {left}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert _digests(tok) == before
    assert dvc_changed(finished) == dvc_before
    # Snakemake marks the interrupted job incomplete (its rule: rerun it); the bytes are DVC's verified ones,
    # so forget that mark for the tests after this one (check=False: it fails where there is no record)
    run(
        [
            "snakemake",
            "--cleanup-metadata",
            "results/tokenize/dataset",
            "results/tokenize/lengths.npy",
            "results/tokenize/stats.json",
        ],
        cwd=finished,
        check=False,
    )
    assert dry_run_stages(finished) == smk_before, run(["snakemake", "-n"], cwd=finished).stdout


# --------------------------------------------------------------------------- fresh clones agree
# Fresh clones agree (issue 19.4, issue 46.5): in a real `git clone` of the finished tiny run (conftest.py),
# `make run` (dvc repro, then snakemake --touch) reruns only tokenize (the dataset is not in git; every byte
# it writes is the committed one, so DVC skips everything downstream), and afterwards `dvc status` and
# `snakemake -n` both name nothing; after a `git checkout` of another commit and `dvc checkout`, `make run`
# again makes them agree; a plain `snakemake` on a fresh clone, after `snakemake --touch --omit-from` the
# outputs of the stages DVC names, plans what `dvc repro` would run and what follows it (Snakemake assumes a
# rerun job changes its outputs), not profile; and DVC's own `dvc plots show` renders offline there.
# Reuses the one finished run (conftest.py); about 50 s of its own on a quiet 2-core machine (two clones,
# tokenize once, stats and compare once, three touches).


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
    ran = set(re.findall(r"Running stage '([\w@-]+)'", out))
    skipped = set(re.findall(r"Stage '([\w@-]+)' didn't change, skipping", out))
    assert ran == {"machine", "source", "tokenize"}, out  # machine, source: always run, their files left as they are
    assert {"stats", "boundaries", "plans", "profile", "train@packed", "quality", "interleave", "compare"} <= skipped, (
        out
    )
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


def test_checkout_of_another_commit_then_dvc_checkout_and_make_run_agree(clone):
    """A second commit (other histogram bins: DVC reruns stats and compare, which draws the histogram), then
    `git checkout` of the first, `dvc checkout` and `make run`: DVC reruns nothing, both tools name nothing,
    and the files are the first commit's. (Without the touch `make run` ends with, `snakemake -n` plans stats
    and compare: its records hold the second commit's params.)"""
    work, _ = clone
    params = work / "params.yaml"
    text = params.read_text()
    assert "histogram_bins: 64" in text
    params.write_text(text.replace("histogram_bins: 64", "histogram_bins: 16"))
    out = run(["dvc", "repro"], cwd=work)
    ran = set(re.findall(r"Running stage '([\w@-]+)'", out.stdout + out.stderr))
    assert "stats" in ran and ran <= {"machine", "source", "stats", "compare"}, ran
    git_commit(work, "16 histogram bins")
    run(["git", "checkout", "-q", "HEAD~1"], cwd=work)
    run(["dvc", "checkout"], cwd=work)
    out = make(work, "run")
    assert not re.findall(r"Running stage '(?!machine|source)", out.stdout + out.stderr), out.stdout + out.stderr
    assert dvc_changed(work) == set()
    assert dry_run_stages(work) == set(), run(["snakemake", "-n"], cwd=work).stdout
    assert _git_status(work) == "" and params.read_text() == text


def test_plain_snakemake_on_a_fresh_clone_plans_what_dvc_would_and_its_downstream(finished, tmp_path):
    """Without `make run`: `dvc status` names tokenize (the dataset is not in git) and the stages reading the
    dataset. Snakemake plans tokenize and everything downstream of it (it assumes a rerun changes its outputs:
    the README names `make run` instead) and, with no records of its own, profile too (the checkout's file
    times; measured: every stage). After `snakemake --touch --omit-from <the outputs of DVC's stages>` (docs/workflow.md) its plan is exactly DVC's stages and their
    downstream."""
    work = tmp_path / "repo"
    run(["git", "clone", "-q", str(finished), str(work)])
    changed = dvc_changed(work)
    assert "tokenize" in changed and "profile" not in changed and "stats" not in changed
    downstream = dvc_downstream(work, changed)
    assert "profile" not in downstream and {"stats", "boundaries", "plans"} <= downstream
    table = dvc_stage_table(work)
    omit = [
        next(iter(o)) if isinstance(o, dict) else o
        for name in changed
        for kind in ("outs", "metrics", "plots")
        for o in table[name].get(kind, [])
    ]
    run(["snakemake", "--touch", "--cores", "1", "--omit-from", *omit], cwd=work)
    assert dry_run_stages(work) == downstream
