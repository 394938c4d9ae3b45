"""lenbatch.lengths_of: per-row lengths from Arrow list offsets, equal to the row loop for every
input kind (Dataset, its .select/.shuffle/.filter views, a save_to_disk folder, Parquet, pyarrow
arrays with int32/int64 offsets, sliced and chunked), refusing null and empty rows. ~3 s."""

from __future__ import annotations

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import lenbatch as lb


def _rows(n: int = 300, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 1000, int(k)).tolist() for k in rng.integers(1, 40, n)]


def _loop(ds, column="input_ids") -> list[int]:
    return [len(r[column]) for r in ds]


def test_a_dataset_and_its_views_give_the_row_loops_lengths_in_row_order(tmp_path):
    ds = datasets.Dataset.from_dict({"input_ids": _rows(), "other": list(range(300))})
    assert lb.lengths_of(ds).tolist() == _loop(ds)
    views = {
        "shuffle": ds.shuffle(seed=3),
        "select": ds.select([5, 2, 2, 299, 0]),
        "filter": ds.filter(lambda r: len(r["input_ids"]) % 3 == 0),
        "contiguous": ds.select(range(17, 150)),
        "shuffled filter": ds.shuffle(seed=1).filter(lambda r: len(r["input_ids"]) > 20),
    }
    for name, view in views.items():
        got = lb.lengths_of(view)
        assert got.tolist() == _loop(view), name
        assert got.dtype == np.int64
    assert views["shuffle"]._indices is not None  # the case the indices mapping is for
    # on disk: the folder (memory-mapped, no datasets needed) and the reloaded dataset; save_to_disk
    # of a shuffled view writes its rows in the view's order
    views["shuffle"].save_to_disk(str(tmp_path / "ds"))
    assert lb.lengths_of(tmp_path / "ds").tolist() == _loop(views["shuffle"])
    assert lb.lengths_of(datasets.load_from_disk(str(tmp_path / "ds"))).tolist() == _loop(views["shuffle"])


def test_pyarrow_inputs_int32_and_int64_offsets_sliced_chunked_and_parquet(tmp_path):
    rows = _rows(50, seed=1)
    want = [len(r) for r in rows]
    small = pa.array(rows, type=pa.list_(pa.int32()))
    large = pa.array(rows, type=pa.large_list(pa.int64()))
    assert lb.lengths_of(small).tolist() == want and lb.lengths_of(large).tolist() == want
    assert lb.lengths_of(small.slice(7, 20)).tolist() == want[7:27]
    assert lb.lengths_of(large.slice(30)).tolist() == want[30:]
    chunked = pa.chunked_array([small.slice(0, 10), small.slice(10, 5), small.slice(15)])
    assert lb.lengths_of(chunked).tolist() == want
    assert lb.lengths_of(pa.table({"input_ids": chunked})).tolist() == want
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12)), 4)
    assert lb.lengths_of(fixed).tolist() == [4, 4, 4]
    pq.write_table(pa.table({"input_ids": large, "x": pa.array(range(50))}), tmp_path / "t.parquet", row_group_size=16)
    assert lb.lengths_of(tmp_path / "t.parquet").tolist() == want
    assert lb.lengths_of(pa.array([3, 1, 2])).tolist() == [3, 1, 2]  # a column of lengths itself


def test_null_empty_and_wrong_inputs_are_refused_with_the_count_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match="2 null row"):
        lb.lengths_of(pa.array([[1], None, [2, 3], None]))
    with pytest.raises(ValueError, match="1 null row"):
        lb.lengths_of(datasets.Dataset.from_dict({"input_ids": [[1], None, [2]]}))
    with pytest.raises(ValueError, match=r"2 empty row\(s\) \(length 0; first at row 1\)"):
        lb.lengths_of(pa.array([[1], [], [2], []]))
    with pytest.raises(ValueError, match=r"no column 'input_ids'.*\['text'\]"):
        lb.lengths_of(datasets.Dataset.from_dict({"text": ["a"]}))
    with pytest.raises(ValueError, match="not a list of tokens"):
        lb.lengths_of(pa.array(["a", "b"]))
    with pytest.raises(ValueError, match="IterableDataset"):
        lb.lengths_of(datasets.Dataset.from_dict({"input_ids": [[1]]}).to_iterable_dataset())
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"input_ids": [[1]]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="DatasetDict.*train"):
        lb.lengths_of(tmp_path / "dd")
    with pytest.raises(ValueError, match="does not exist"):
        lb.lengths_of(tmp_path / "missing")
