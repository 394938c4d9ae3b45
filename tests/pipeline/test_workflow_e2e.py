"""The whole DAG for real, on configs/tiny.yaml merged into params.yaml: `make run` (dvc repro, then
lenbatch sync; the `finished` fixture of conftest.py) drives Snakemake through every stage (real tokenizer,
real data, real torchrun) and leaves both tools agreeing; a code edit or any params key makes `snakemake -n` and `dvc status` name the same stages;
`dvc exp run --temp` reruns only what K touches and the experiment diffs in a few columns; a
--configfile run keeps to its own results root; deleting a strategy's results rebuilds it; an
interrupted run stops promptly and resumes without redoing finished outputs."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from lenbatch.stages.sync import changed_stages
from test_reruns import RERUNS, dvc_stages
from test_workflow import BIN, ENV, ROOT, job_counts, run

# one worker builds and uses the shared finished run (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("finished")]


def dry_run_stages(work: Path, *extra: str, snakemake: tuple[str, ...] = ("snakemake",)) -> set[str]:
    """Jobs `snakemake -n` would run, named as DVC names its stages (train-<strategy>)."""
    out = run([*snakemake, "-n", *extra], cwd=work).stdout
    stages = set()
    for block in re.split(r"\n(?=rule \w+:)", out):
        m = re.match(r"rule (\w+):", block)
        if m and m.group(1) != "all":
            wc = re.search(r"wildcards: strategy=(\w+)", block)
            stages.add(f"{m.group(1)}-{wc.group(1)}" if wc else m.group(1))
    return stages


def dvc_changed(work: Path) -> set[str]:
    status = json.loads(run(["dvc", "status", "--json"], cwd=work).stdout or "{}")
    return set(changed_stages(status))  # the rule lenbatch sync uses: "machine: always changed" is no change


def dvc_downstream(work: Path, changed: set[str]) -> set[str]:
    """``changed`` and every stage downstream of it in dvc.yaml (an output of one is a dep of the next):
    what `dvc repro` runs when each rerun stage rewrites its outputs (Snakemake always assumes so)."""
    stages = yaml.safe_load((work / "dvc.yaml").read_text())["stages"]
    outs = {name: {next(iter(o)) if isinstance(o, dict) else o
                   for kind in ("outs", "metrics", "plots") for o in st.get(kind, [])} for name, st in stages.items()}
    found, todo = set(changed), list(changed)
    while todo:
        up = todo.pop()
        for name, st in stages.items():
            if name not in found and outs[up] & set(st.get("deps", [])):
                found.add(name)
                todo.append(name)
    return found


def test_every_stage_wrote_its_outputs(finished):
    strategies = yaml.safe_load((finished / "params.yaml").read_text())["train"]["strategies"]
    for path in ("results/tokenize/lengths.npy", "results/stats/stats.json", "results/boundaries/sweep.json",
                 "results/plans/metrics.json", "results/profile/grid.json", "results/compare/report.md",
                 "results/compare/quality.png", "results/quality/quality.json"):
        assert (finished / path).stat().st_size > 0, path
    for strategy in strategies:
        summary = json.loads((finished / f"results/train/{strategy}/summary.json").read_text())
        assert summary["useful_tokens_per_s"] > 0
    metrics = json.loads((finished / "results/compare/metrics.json").read_text())
    for strategy in strategies:
        assert any(key.startswith(strategy) for key in metrics), f"{strategy} missing from compare metrics"
    report = (finished / "results/compare/report.md").read_text()
    assert all(s in report for s in strategies)
    assert "![quality](quality.png)" in report  # the quality section and its plot are compare's
    assert not (finished / "results/quality/report.md").exists() and not (finished / "results/quality/quality.png").exists()
    assert (finished / "logs/tokenize.log").exists() and (finished / "logs/benchmarks/train/packed.tsv").exists()


def test_both_tools_agree_after_make_run(finished):
    assert dvc_changed(finished) == set(), run(["dvc", "status"], cwd=finished).stdout
    assert "Nothing to be done" in run(["snakemake", "-n"], cwd=finished).stdout


def test_another_machine_reruns_the_measuring_stages_in_both_tools(finished):
    """The machine fingerprint is a dependency (issue 19): a Python with other library versions (the fla venv:
    flash-linear-attention and another triton) is another machine; after `lenbatch machine` there (what
    `dvc repro` runs first) `dvc status` names profile, every training and quality, and `snakemake -n` run by
    that Python (which writes the fingerprint as it parses) plans those and compare. The same machine: nothing."""
    other = ROOT / ".venv-fla" / "bin" / "python"
    if not other.exists():
        pytest.skip(f"{other} is absent (make .venv-fla/.lenbatch-fla-installed builds it; make test does)")
    path = finished / "results/machine/machine.json"
    saved, st = path.read_bytes(), path.stat()
    strategies = yaml.safe_load((finished / "params.yaml").read_text())["train"]["strategies"]
    measuring = {"profile", "quality", *(f"train-{s}" for s in strategies)}
    try:
        run([str(other), "-m", "lenbatch", "machine", "--out", "results/machine"], cwd=finished)
        assert path.read_bytes() != saved
        assert dvc_changed(finished) == measuring
        assert dry_run_stages(finished, snakemake=(str(other), "-m", "snakemake")) == measuring | {"compare"}
    finally:
        path.write_bytes(saved)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    run(["lenbatch", "machine", "--out", "results/machine"], cwd=finished)  # this machine: the file is left as it is
    assert path.read_bytes() == saved and path.stat().st_mtime_ns == st.st_mtime_ns
    assert dvc_changed(finished) == set() and dry_run_stages(finished) == set()


@pytest.mark.parametrize("edit", [
    "code:corpus/chat.py", "code:cli/flags.py", "code:loading/collate.py", "code:batching/padding.py",
    "code:stages/compare.py", "code:analysis/stepmodel.py", "code:analysis/report.py",
    "code:batching/strategies.py", "code:analysis/quality_report.py", "code:pipeline/registry.py",
    "train.warmup_steps=2", "train.queue_size=3", "train.checkpoint_every=7", "train.reuse_host_memory=false",
    "train.useful_tokens=6100", "train.threads=2", "boundaries.num_buckets=2", "batching.packed_window=4",
    "data.max_len=1000", "profile.repeats=2", "compare.k_tolerance=0.02", "drafter.lr=0.001",
    "stats.histogram_bins=32", "plans.epochs=3", "model.init_seed=1",
])
def test_snakemake_and_dvc_name_the_same_stages(finished, edit):
    """For a code edit and for params keys of every section, `snakemake -n` and `dvc status` name the same
    stages: Snakemake's jobs are the stages `dvc status` names plus those downstream of them (Snakemake
    reports only the first reason per job, so its list is compared with DVC's after propagation). For a
    code edit, the stages `dvc status` names are those of test_reruns.RERUNS: the table holds on a real edit."""
    params = finished / "params.yaml"
    original = params.read_text()
    kind, _, what = edit.partition(":")
    if kind == "code":
        path = finished / "src/lenbatch" / what
        saved = path.read_text()
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
        if kind == "code":
            path.write_text(saved)
    if kind == "code":
        strategies = yaml.safe_load(original)["train"]["strategies"]
        assert changed == dvc_stages(RERUNS[what], strategies), f"{edit}: dvc status {sorted(changed)}"
        assert smk == dvc_downstream(finished, dvc_stages(RERUNS[what], strategies)), f"{edit}: snakemake -n {smk}"
    if edit in ("code:cli/flags.py", "code:pipeline/registry.py"):  # help strings, flags, the table: no code dep
        assert smk == dvc == set(), (smk, dvc)
        return
    if edit in ("code:analysis/stepmodel.py", "code:analysis/report.py", "code:analysis/quality_report.py"):
        assert smk == dvc == {"compare"}, (smk, dvc)  # the prediction fit and the reports rerun no measurement
    assert smk, f"{edit}: snakemake plans nothing"
    assert smk == dvc, f"{edit}: snakemake -n {sorted(smk)} but dvc status {sorted(dvc)}"
    if edit.startswith(("train.warmup_steps", "train.queue_size", "train.checkpoint_every")):
        assert "profile" not in smk  # profile never reads them
    if edit.startswith("boundaries.num_buckets"):
        # quality trains every strategy, bucketed included, so the edges rerun it too
        assert changed == {"boundaries", "compare"} and smk == {"boundaries", "plans", "train-bucketed", "quality",
                                                                 "compare"}


def test_temp_experiment_reruns_only_what_k_touches(finished):
    """`dvc exp run --temp` (what --queue uses): the dataset comes from DVC's cache, the other results
    from git, so a K change reruns boundaries, plans, train-bucketed, quality (it trains bucketed too) and
    compare only; the experiment
    shows at most ~20 changed columns."""
    t0 = time.time()
    out = run(["dvc", "exp", "run", "--temp", "-n", "k2", "-S", "boundaries.num_buckets=2"], cwd=finished,
              timeout=900)
    text = out.stdout + out.stderr
    ran = set(re.findall(r"Running stage '([\w-]+)'", text))
    assert ran == {"boundaries", "plans", "train-bucketed", "quality", "compare"}, text
    shown = run(["dvc", "exp", "show", "--only-changed", "--csv"], cwd=finished).stdout
    columns = next(csv.reader(io.StringIO(shown)))
    print(f"\n--temp K experiment: {time.time() - t0:.0f} s; exp show --only-changed: {len(columns)} columns")
    print(run(["dvc", "exp", "show", "--only-changed", "--md"], cwd=finished).stdout)
    assert len(columns) <= 22, columns  # ~20 plus the Experiment and rev columns
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
    from lenbatch.pipeline.dvcplots import _assets

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
    for config, root in (("configs/tiny.yaml", "results/tiny/"),
                         ("configs/qwen3.6-27b-8gpu.yaml", "results/qwen3.6-27b-8gpu/")):
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


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def test_sigint_to_snakemake_stops_training_promptly_and_resumes(finished, tmp_path):
    """SIGINT to snakemake alone (not its process group): the training stops within seconds (Snakemake
    alone would wait for it to finish), and the rerun redoes only the interrupted jobs."""
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"train": {"useful_tokens": 6200}}))
    args = ["snakemake", "--cores", "2", "--configfile", str(changed), "--", "results/train/sorted/summary.json"]
    lengths = finished / "results/tokenize/lengths.npy"
    before = lengths.stat().st_mtime_ns
    proc = subprocess.Popen(args, cwd=finished, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        if any("lenbatch" in Path(f"/proc/{p}/cmdline").read_text(errors="ignore")
               for p in _descendants(proc.pid) if Path(f"/proc/{p}/cmdline").exists()):
            break
        time.sleep(0.5)
    time.sleep(3)
    t0 = time.time()
    os.kill(proc.pid, signal.SIGINT)  # snakemake only
    proc.wait(timeout=60)
    stopped = time.time() - t0
    print(f"\nsnakemake stopped {stopped:.1f} s after SIGINT")
    try:
        assert proc.returncode != 0, "the run finished before it could be interrupted"
        # measured: 1.7 s; without the Snakefile's forwarding, 25 s (the tiny training ran to its end)
        assert stopped < 10, f"snakemake took {stopped:.0f} s to stop after SIGINT"
        time.sleep(2)
        left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert not left, f"processes of the interrupted run still alive: {left}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group this test started, if anything is left
        except ProcessLookupError:
            pass
    run([*args[:-2], "--rerun-incomplete", *args[-2:]], cwd=finished, timeout=900)
    assert lengths.stat().st_mtime_ns == before, "a finished output was redone"
    assert "Nothing to be done" in run(["snakemake", "-n", "--configfile", str(changed), *args[-2:]],
                                       cwd=finished).stdout
