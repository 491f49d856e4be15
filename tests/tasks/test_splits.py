"""Tests for tasks/data/splits.py: the one owner of the train / validation / test split."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tasks.data.curate
import tasks.data.eval_sets
import tasks.data.splits
from dapo_core.curation_pass import split_validation
from tasks.data.splits import Splits, eval_problems, splits
from tasks.data.tables import TRAIN_SCHEMA
from tasks.params import load_params


def ids(problems) -> set[str]:
    return {p.id for p in problems}


def synthetic_cfg(*extra: str):
    return load_params(
        overrides=["synthetic.num_train=120", "synthetic.num_test=30", "data.val_size=16", *extra]
    )


def test_synthetic_splits_are_disjoint_sized_and_deterministic():
    cfg = synthetic_cfg()
    s = splits(cfg)
    assert (len(s.train), len(s.val), len(s.test)) == (104, 16, 30)
    train, val, test = ids(s.train), ids(s.val), ids(s.test)
    assert len(train | val | test) == 150  # pairwise disjoint, no repeats
    assert not {p.problem for p in s.train} & {p.problem for p in s.test}
    again = splits(cfg)
    assert (again.train, again.val, again.test) == (s.train, s.val, s.test)
    # validation is carved out of the generated training problems with curation's hash rule
    generated = s.train + s.val
    _, val_rule = split_validation(generated, 16, id_of=lambda p: p.id)
    assert ids(val_rule) == val
    # the test split is the eval set synthetic-test
    assert eval_problems(cfg, "synthetic-test") == ("synthetic-test", s.test)


def test_val_size_zero_and_too_large():
    assert splits(synthetic_cfg("data.val_size=0")).val == []
    with pytest.raises(Exception, match="data.val_size"):
        splits(synthetic_cfg("data.val_size=120"))


def write_table(path, rows):
    full = [
        {**r, "source": "t", "prompt": r["problem"], "source_id": None, "source_row": i}
        | {"original_answer": r["answer"], "answer_form": "integer", "copies": 1}
        for i, r in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(full, schema=TRAIN_SCHEMA), path)


@pytest.fixture
def curated(tmp_path, monkeypatch):
    """A curated out_dir (train.parquet, val.parquet, the report of the source they were curated
    from) and an eval set, under a fake repo root."""
    monkeypatch.setattr(tasks.data.curate, "repo_path", lambda p: tmp_path / p)
    out = tmp_path / "data" / "curated"
    out.mkdir(parents=True)
    report = {"source_kind": "file", "source": "x.parquet", "source_sha256": "0" * 64}
    (out / "report.json").write_text(json.dumps(report))
    write_table(
        out / "train.parquet",
        [{"id": f"t{i}", "problem": f"T{i}", "answer": "1"} for i in range(5)],
    )
    write_table(
        out / "val.parquet", [{"id": f"v{i}", "problem": f"V{i}", "answer": "2"} for i in range(3)]
    )
    eval_file = tmp_path / "ev.parquet"
    write_table(eval_file, [{"id": "e0", "problem": "E0", "answer": "3"}])
    return load_params(
        overrides=[
            "data.source=data/raw/x.parquet",
            "data.out_dir=data/curated",
            "data.val_size=3",
            f"eval.eval_set={eval_file}",
        ]
    )


def test_curated_splits_read_the_parquet_files(curated):
    s = splits(curated)
    assert [p.id for p in s.train] == [f"t{i}" for i in range(5)]
    assert [p.id for p in s.val] == ["v0", "v1", "v2"]
    assert [p.id for p in s.test] == ["e0"]
    assert s.train[0].answer == "1" and s.val[0].problem == "V0"
    assert not ids(s.train) & ids(s.val) and not ids(s.train) & ids(s.test)


def test_curated_val_follows_val_size(curated):
    from dapo_core.config_loader import resolve

    smaller = resolve(curated.to_dict(), overrides=["data.val_size=2"])
    assert [p.id for p in splits(smaller).val] == ["v0", "v1"]
    assert splits(resolve(curated.to_dict(), overrides=["data.val_size=0"])).val == []


def test_a_missing_eval_set_does_not_stop_training(curated, tmp_path, monkeypatch):
    """Test is read on first access only: train and val need no eval set."""
    from dapo_core.config_loader import resolve

    monkeypatch.setattr(tasks.data.eval_sets, "repo_path", lambda p: tmp_path / p)
    cfg = resolve(
        curated.to_dict(),
        overrides=[
            'data.eval_sets={"aime-2024": "BytedTsinghua-SIA/AIME-2024"}',
            "eval.eval_set=aime-2024",
        ],
    )
    s = splits(cfg)
    assert len(s.train) == 5 and len(s.val) == 3
    with pytest.raises(FileNotFoundError, match="not prepared"):
        _ = s.test


def test_test_is_read_once():
    calls = []
    s = Splits([], [], lambda: calls.append(1) or ["x"])
    assert s.test == ["x"] and s.test == ["x"] and calls == [1]


def test_problems_digest_is_order_free_and_sees_ids_and_answers():
    from dapo_core.problem import Problem
    from tasks.data.version import pairs_digest, problems_digest

    a = Problem("1", "1+1", "2", "1+1", "s")
    b = Problem("2", "2+2", "4", "2+2", "s")
    assert (
        problems_digest([a, b]) == problems_digest([b, a]) == pairs_digest([("2", "4"), ("1", "2")])
    )
    assert problems_digest([a, b]) != problems_digest([a])
    assert problems_digest([a, b]) != problems_digest([a, Problem("2", "2+2", "5", "2+2", "s")])
