"""The README is a front door: small, its quickstart runs as written, its one results table is the
committed report's, and every link it gives leads to a file."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def test_the_readme_is_at_most_15000_bytes():
    assert len(README.read_bytes()) <= 15_000, len(README.read_bytes())


def test_the_quickstart_runs_as_written():
    text = README.read_text()
    part = text[text.index("\n## Quickstart\n"):text.index("\n## Strategies\n")]
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
    out = subprocess.run([sys.executable, "-m", "lenbatch_study", "readme", "--check"], cwd=ROOT,
                         capture_output=True, text=True)
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


def test_the_results_block_is_the_answer_and_a_table_of_at_most_8_columns():
    from lenbatch_study.tools import readme

    text = README.read_text()
    block = text[text.index(readme.BEGIN) + len(readme.BEGIN):text.index(readme.END)]
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
