"""Preference pairs: mining from scored groups (train split only, never equal rewards), the
Parquet table with its provenance, and reading files with malformed rows set aside."""

import json

import pytest
from typer.testing import CliRunner

from dapo_core.errors import PipelineError
from dapo_core.problem import Problem
from tasks.params import load_params
from tasks.preferences import pairs as P


def _problems(n: int, prefix: str = "train") -> list[Problem]:
    return [
        Problem(f"{prefix}-{i}", f"{prefix}: {i} + 1?", str(i + 1), f"{i}+1", "t") for i in range(n)
    ]


def _generate(problems):
    """Four responses a problem: all right when its answer n is even, right and wrong in turn
    when n is odd."""
    out = []
    for p in problems:
        n = int(p.answer)
        right, wrong = f"Answer: {n}", f"Answer: {n + 7}"
        out.append([right if (j % 2 == 0 or n % 2 == 0) else wrong for j in range(4)])
    return out


def test_mined_pairs_are_correct_over_incorrect_from_mixed_groups_of_the_train_split():
    cfg = load_params(overrides=["rollout.group_size=4", "train.gen_batch=3"])
    train = _problems(10)
    table = P.mine(cfg, _generate, train, prompts=8, per_group=2, seed=1)
    assert table.rows, "some groups are mixed"
    ids = {p.id for p in train}
    for row in table.rows:
        assert row["problem_id"] in ids
        assert row["chosen_reward"] > row["rejected_reward"]  # never two of equal reward
        assert row["chosen"] != row["rejected"]
    per_problem = {}
    for row in table.rows:
        per_problem[row["problem_id"]] = per_problem.get(row["problem_id"], 0) + 1
    assert max(per_problem.values()) <= 2
    # answers n = i + 1: the group is mixed when n is odd (every other response wrong)
    mixed = {p.id for p in train if int(p.answer) % 2}
    assert set(per_problem) <= mixed
    prov = table.provenance
    assert prov["pairs"] == len(table.rows) and prov["groups"] == 8
    assert prov["sampling"]["group_size"] == 4 and prov["mining"]["seed"] == 1
    assert len(prov["data"]["train_digest"]) == 16
    again = P.mine(cfg, _generate, train, prompts=8, per_group=2, seed=1)
    assert again.rows == table.rows  # the seed decides the problems and the pairs


def test_mining_the_real_splits_never_reaches_validation_or_test_problems(tiny_cfg):
    from tasks.data.splits import splits

    s = splits(tiny_cfg)
    held = {p.id for p in s.val} | {p.id for p in s.read_test()}
    table = P.mine(tiny_cfg, _generate, s.train, prompts=len(s.train), per_group=1)
    assert table.rows and not {r["problem_id"] for r in table.rows} & held


def test_the_table_round_trips_with_its_provenance(tmp_path):
    rows = [
        {
            "prompt": "x",
            "chosen": "a",
            "rejected": "b",
            "problem_id": "1",
            "chosen_reward": 1.0,
            "rejected_reward": -1.0,
        }
    ]
    path = P.write_pairs(P.PairTable(rows, {"model": {"path": "m"}}), tmp_path / "p.parquet")
    back = P.read_pairs(str(path))
    assert back.rows == rows and back.provenance == {"model": {"path": "m"}}
    assert not back.quarantined


def test_an_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pq, "write_table", boom)
    table = P.PairTable([{"prompt": "x", "chosen": "a", "rejected": "b"}], {})
    with pytest.raises(KeyboardInterrupt):
        P.write_pairs(table, tmp_path / "p.parquet")
    assert list(tmp_path.iterdir()) == []


def test_no_pairs_is_refused_before_writing(tmp_path):
    with pytest.raises(PipelineError, match="no pairs"):
        P.write_pairs(P.PairTable([], {}), tmp_path / "p.parquet")
    assert list(tmp_path.iterdir()) == []


def test_malformed_rows_are_set_aside_and_counted(tmp_path):
    good = {"prompt": "q", "chosen": "a", "rejected": "b"}
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({"prompt": "q", "chosen": "", "rejected": "b"}),
        json.dumps({"prompt": "q", "chosen": "a", "rejected": "a"}),
        json.dumps({"prompt": "held", "chosen": "a", "rejected": "b"}),
        json.dumps([1, 2]),
        "",
    ]
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines))
    table = P.read_pairs(str(path), held_out=["held"])
    assert table.rows == [good]
    assert table.quarantined == {
        "lines that are not JSON objects": 2,
        "missing or empty chosen": 1,
        "chosen equal to rejected": 1,
        "a validation or test prompt": 1,
    }
    assert "5 rows set aside" in table.summary()


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.jsonl", None, "not found"),
        ("empty.jsonl", "", "no usable pairs"),
        ("cols.jsonl", json.dumps({"prompt": "q", "answer": "a"}), "no chosen, rejected column"),
        ("bad.json", "{", "not valid JSON"),
        ("pairs.csv", "prompt,chosen,rejected\n", ".parquet, .jsonl or .json"),
        ("broken.parquet", "not parquet", "not a readable Parquet file"),
        ("folder.jsonl", "DIR", "is a folder; give a pairs file"),
        ("pulled.parquet", "DVC", "tracked by DVC but not here: `dvc pull .*pulled.parquet`"),
    ],
)
def test_bad_pairs_files_are_one_line_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content == "DVC":  # its record is in the checkout, its data is not pulled
        path.with_name(name + ".dvc").write_text("outs:\n- md5: 0\n  path: " + name + "\n")
    elif content == "DIR":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(PipelineError, match=message):
        P.read_pairs(str(path))


def test_a_mistyped_local_path_is_not_found_a_hub_id_out_of_reach_is_one_line(
    tmp_path, monkeypatch
):
    """data/pairs/pairs (no suffix) was taken for a hub id and "could not be loaded from the
    hub"; a hub id with the hub out of reach retried for half a minute, a warning a try."""
    import datasets
    import huggingface_hub.constants as hub

    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineError, match="pairs file data/pairs/pairs not found"):
        P.read_pairs("data/pairs/pairs")
    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)

    def asked(*args, **kwargs):
        raise AssertionError("datasets was asked for a hub id out of reach")

    monkeypatch.setattr(datasets, "load_dataset", asked)
    with pytest.raises(PipelineError) as e:
        P.read_pairs("some-owner/some-pairs")
    said = str(e.value)
    assert said.startswith("pairs dataset some-owner/some-pairs: the hub at http://127.0.0.1:9")
    assert "HF_HUB_OFFLINE=1 reads a cached copy" in said and "\n" not in said


def test_pairs_show_says_what_is_wrong_in_one_line(tmp_path):
    from flows.cli import app

    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "a"}) + "\n")
    out = CliRunner().invoke(app, ["pairs", "show", str(path)])
    assert out.exit_code != 0
    assert "no usable pairs" in out.output and "Traceback" not in out.output


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("p.jsonl", "written as .parquet"),
        ("afile/p.parquet", "afile is a file, not a folder"),
        ("folder.parquet", "is a folder; name the .parquet file"),
        ("other.parquet", "holds other data"),  # a table mining did not write is not replaced
    ],
)
def test_pairs_mine_refuses_an_out_it_cannot_or_should_not_write_before_sampling(
    tmp_path, monkeypatch, out, message
):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.models import loading

    monkeypatch.setattr(loading, "load_policy", lambda *a: pytest.fail("sampled"))
    (tmp_path / "afile").write_text("")
    (tmp_path / "folder.parquet").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "other.parquet")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(PipelineError, match=message):
        P.mine_to_file(load_params(), tmp_path / out, prompts=4)
    assert sorted(tmp_path.rglob("*")) == before


def test_pairs_mine_replaces_pairs_it_mined(tmp_path):
    table = P.PairTable([{"prompt": "q", "chosen": "a", "rejected": "b"}], {"groups": 1})
    P.write_pairs(table, tmp_path / "p.parquet")
    assert P.PROVENANCE_KEY in P._parquet_metadata(tmp_path / "p.parquet")
    P._check_out(tmp_path / "p.parquet")  # no error: a re-mine replaces its own table


@pytest.mark.parametrize("when", ["during the write", "while sampling"])
def test_a_ctrl_c_held_for_the_write_says_the_table_is_complete(tiny_cfg, tmp_path, monkeypatch,
                                                                when):  # fmt: skip
    """A Ctrl-C during the table's write (and its `dvc add`) waits for it, then stopped the
    command saying "run the same command to start again", though the table was whole."""
    import os
    import signal

    from dapo_core.errors import TrainingInterrupted

    # Python's handler: a background job's is ignored (put back after, as the suite checks)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    write = P.write_pairs

    def interrupted_write(table, out):
        os.kill(os.getpid(), signal.SIGINT)  # held: the write goes on
        return write(table, out)

    def interrupted_mining(*args, **kwargs):
        raise KeyboardInterrupt

    mined = P.PairTable([{"prompt": "x", "chosen": "a", "rejected": "b"}], {})
    monkeypatch.setattr(P, "mine", lambda *a, **k: mined)
    try:
        if when == "during the write":
            monkeypatch.setattr(P, "write_pairs", interrupted_write)
            with pytest.raises(TrainingInterrupted, match="p.parquet was written: it is complete"):
                P.mine_to_file(tiny_cfg, tmp_path / "p.parquet", prompts=4, dvc=False)
            assert P.read_pairs(str(tmp_path / "p.parquet")).rows
        else:
            monkeypatch.setattr(P, "mine", interrupted_mining)
            with pytest.raises(KeyboardInterrupt):
                P.mine_to_file(tiny_cfg, tmp_path / "p.parquet", prompts=4, dvc=False)
            assert not (tmp_path / "p.parquet").exists()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_empty_pairs_name_is_said_so(tmp_path):
    """`--pairs ""` was read as the current folder: "error:  is a folder"."""
    with pytest.raises(PipelineError, match="^no pairs file named; give one"):
        P.read_pairs("")
