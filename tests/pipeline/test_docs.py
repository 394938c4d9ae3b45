"""The README is a front door: small, its quickstart runs as written, its one results table is the
committed report's, and every link it gives leads to a file. And every Python block of README.md and
docs/*.md runs as written: here (each section's blocks in order, in one fresh interpreter, CPU, tiny
models), or in the test that runs its section with checks of what the prose says (RUN_ELSEWHERE), or it
carries the marker ``<!-- not run: why -->`` on the line before it (none today: keep them few)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_is_at_most_15000_bytes():
    assert len(README.read_bytes()) <= 15_000, len(README.read_bytes())


def test_the_quickstart_runs_as_written():
    text = README.read_text()
    part = text[text.index("\n## Quickstart\n") : text.index("\n## Strategies\n")]
    blocks = re.findall(r"```python\n(.*?)```", part, flags=re.S)
    assert len(blocks) == 1 and len(blocks[0].splitlines()) <= 25
    code = blocks[0] + textwrap_checks()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    predicted, planned = (float(x) for x in re.findall(r"([\d.]+)%", out.stdout.splitlines()[0]))
    assert 50 < predicted <= 100 and 50 < planned <= 100
    assert out.stdout.splitlines()[-1] == "OK"


def textwrap_checks() -> str:
    """What the quickstart's prose claims: every sample once per epoch, the epochs differ, and the state
    saved mid-epoch resumes at the batch after it."""
    return """
import lenbatch as lb
seen = [sorted(i for b in sampler.plan(e) for i in b) for e in (0, 1)]
assert seen[0] == seen[1] == list(range(len(dataset)))
assert [list(b) for b in sampler.plan(0)] != [list(b) for b in sampler.plan(1)]
again = lb.LengthBatchSampler(lengths, strategy="bucketed", edges=b.edges, token_budget=16384, max_batch_size=64, seed=0)
again.load_state_dict(state)
again.set_epoch(1)
assert [list(x) for x in again] == [list(x) for x in sampler.plan(1)][4:]
print("OK")
"""


def test_the_results_table_is_the_committed_reports():
    out = subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "readme", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    text = README.read_text()
    report = (ROOT / "results/compare/report.md").read_text()
    answer = report.split("## Answer", 1)[1].strip().split(". ")[0]
    assert "| sorted |" in text and answer in text  # the table never without the answer's caveat


def test_readme_links_lead_to_files():
    for link in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if "://" not in link:
            assert (ROOT / link).exists(), link


def test_the_readme_writer_refuses_a_readme_without_markers(tmp_path):
    from lenbatch_study.tools import readme

    (tmp_path / "R.md").write_text("# no markers\n")
    try:
        readme.run(readme=str(tmp_path / "R.md"), report=str(ROOT / "results/compare/report.md"))
    except ValueError as e:
        assert "marker lines" in str(e)
    else:
        raise AssertionError("a README without markers was accepted")


DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = "<!-- not run:"
# Sections whose blocks a dedicated test runs (under torchrun, accelerate launch, 2 Lightning processes, or
# with the prose's claims checked between blocks): (file, section) -> that test, which names the section or
# the file ("" = the part before the first ## heading).
RUN_ELSEWHERE = {
    ("README.md", "Quickstart"): "tests/pipeline/test_docs.py",
    ("docs/library.md", "Use it in your trainer"): "tests/loading/test_readme_trainer.py",
    ("docs/integrations.md", "accelerate"): "tests/loading/test_accelerate.py",
    ("docs/integrations.md", "Lightning"): "tests/loading/test_lightning.py",
    ("docs/integrations.md", "Samples longer than the token budget"): "tests/loading/test_integrations_doc.py",
    ("docs/streaming.md", ""): "tests/loading/test_streaming_doc.py",
    ("docs/choosing.md", "Every strategy on your lengths, in one call"): "tests/batching/test_choosing_doc.py",
}


def doc_blocks() -> dict[tuple[str, str], list[str]]:
    """Every ```python block of the docs, by (file, its ## section), in order; marked ones left out."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in DOCS:
        section, lines = "", path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if lines[i].startswith("## "):
                section = lines[i][3:].strip()
            if lines[i].strip() == "```python":
                end = lines.index("```", i + 1)
                marked = i > 0 and lines[i - 1].startswith(NOT_RUN)
                if not marked:
                    out.setdefault((str(path.relative_to(ROOT)), section), []).append("\n".join(lines[i + 1 : end]))
                i = end
            i += 1
    return out


# (docs/integrations.md's "Packed rows and gradient accumulation in your own loop" runs here in one
# process, and under 2 processes in tests/loading/test_accelerate.py)
RUN_HERE = sorted(k for k in doc_blocks() if k not in RUN_ELSEWHERE)


def test_every_doc_block_is_run_somewhere():
    blocks = doc_blocks()
    assert sum(map(len, blocks.values())) >= 20
    for (doc, section), test in RUN_ELSEWHERE.items():
        assert (doc, section) in blocks, (doc, section)  # a renamed section must be renamed here too
        text = (ROOT / test).read_text()
        assert (section and f"{section}" in text) or Path(doc).name in text, (doc, section, test)
    assert RUN_HERE, "no block left to run here"
    marked = sum(p.read_text().count(NOT_RUN) for p in DOCS)
    assert marked <= 3, f"{marked} blocks marked not run: keep such exceptions few"


@pytest.mark.parametrize("doc, section", RUN_HERE, ids=[f"{d}:{s}" for d, s in RUN_HERE])
def test_doc_section_runs_as_written(doc, section, tmp_path):
    code = "\n".join(doc_blocks()[(doc, section)])
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env.update(OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", TOKENIZERS_PARALLELISM="false")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]


def test_the_results_block_is_the_answer_and_a_table_of_at_most_8_columns():
    from lenbatch_study.tools import readme

    text = README.read_text()
    block = text[text.index(readme.BEGIN) + len(readme.BEGIN) : text.index(readme.END)]
    header = next(line for line in block.splitlines() if line.startswith("| strategy"))
    assert 2 <= header.count("|") - 1 <= 8, header
    assert block.strip().startswith(("**Use `", "**Tie: ", "**Not settled")), block[:80]
    assert len((ROOT / "results/compare/report.md").read_bytes()) <= 10_000


def test_the_readme_table_is_rewritten_only_from_the_default_params(tmp_path, capsys):
    """A report made with other params (a user's data) leaves the README's embedded-default table alone, saying
    why; the committed report (default params) rewrites it."""
    import json
    import shutil

    from lenbatch_study.tools import readme

    report = tmp_path / "compare" / "report.md"
    shutil.copytree(ROOT / "results/compare", report.parent)
    stale = readme.with_table(README.read_text(), "an old table\n")
    (tmp_path / "R.md").write_text(stale)
    resolved = json.loads((report.parent / "params.json").read_text())
    resolved["data"]["source"] = "my_chats.jsonl"
    (report.parent / "params.json").write_text(json.dumps(resolved))
    assert readme.run(readme=str(tmp_path / "R.md"), report=str(report)) == 0
    assert (tmp_path / "R.md").read_text() == stale
    assert "data.source" in capsys.readouterr().err
    shutil.copy(ROOT / "results/compare/params.json", report.parent / "params.json")
    assert readme.run(readme=str(tmp_path / "R.md"), report=str(report)) == 0
    assert (tmp_path / "R.md").read_text() != stale and "an old table" not in (tmp_path / "R.md").read_text()
