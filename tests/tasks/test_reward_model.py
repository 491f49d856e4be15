"""The Bradley-Terry reward model: split by prompt, trained and saved as an ordinary model
directory, tracked in MLflow; bad input and interrupts leave nothing half-written."""

import re

import pytest
import torch

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError, TrainingInterrupted
from tasks.models import learned_reward as S
from tasks.preferences import pairs as P
from tasks.preferences import reward_model as RM
from tasks.preferences.common import split_by_prompt


def _rows(n: int, prompt=lambda i: f"Compute {i} + 1."):
    return [
        {"prompt": prompt(i), "chosen": f"Answer: {i + 1}", "rejected": f"Answer: {i + 2}"}
        for i in range(n)
    ]


def test_a_prompts_pairs_stay_on_one_side_of_the_split():
    rows = _rows(40) + _rows(40)  # every prompt twice
    train, held = split_by_prompt(rows, 0.25, seed=3)
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in held})
    assert len(train) + len(held) == 80 and 0 < len(held) < 40
    assert split_by_prompt(rows, 0.25, seed=3) == (train, held)
    assert split_by_prompt(rows, 0.25, seed=4) != (train, held)


@pytest.fixture
def pairs_file(tiny_cfg, tmp_path):
    from tasks.data.splits import splits

    train = splits(tiny_cfg).train
    rows = [
        {
            "prompt": p.prompt,
            "chosen": f"Answer: {p.answer}",
            "rejected": f"Answer: {int(p.answer) + 3}",
        }
        for p in train
    ]
    return str(
        P.write_pairs(P.PairTable(rows, {"model": {"path": "tiny"}}), tmp_path / "pairs.parquet")
    )


@pytest.fixture
def cfg(tiny_cfg, tmp_path):
    return resolve(
        tiny_cfg.to_dict(), overrides=[f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    )


def test_trains_saves_an_ordinary_directory_and_logs_to_mlflow(cfg, pairs_file, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tasks.tracking.store import read_run, tracking_uri

    out = tmp_path / "rm"
    steps = []
    r = RM.train_reward_model(
        cfg,
        pairs_file,
        out,
        epochs=2,
        lr=1e-3,
        batch_size=8,
        on_step=lambda s, t, m: steps.append(s),
    )
    assert r.steps == 2 * -(-r.train_pairs // 8) and steps[-1] == r.steps
    assert r.train_pairs + r.heldout_pairs == len(P.read_pairs(pairs_file).rows)
    record = S.reward_model_record(out)
    assert record["heldout_pairs"] == r.heldout_pairs and record["pairs_provenance"] == {
        "model": {"path": "tiny"}
    }
    assert sum(b.count for b in r.calibration) == 2 * r.heldout_pairs
    # an ordinary directory: transformers loads it, and it scores as training did
    model = AutoModelForSequenceClassification.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    rows = P.read_pairs(pairs_file).rows[:3]
    pairs = RM.encode(tok, rows, 64)
    ids = torch.tensor([pairs[0][0]])
    with torch.no_grad():
        direct = model(input_ids=ids).logits[0, 0]
        ours = S.rewards(model, [pairs[0][0]], tok.pad_token_id)[0]
    assert torch.isclose(direct, ours, atol=1e-5)
    run = read_run(r.run_id, tracking_uri(cfg))
    assert run["status"] == "FINISHED" and run["experiment"].endswith("reward_model")
    assert run["metrics"]["rm/heldout_accuracy"] == pytest.approx(r.heldout_accuracy)
    assert {"rm/loss", "rm/heldout_ece"} <= set(run["metrics"])


def test_an_interrupted_training_leaves_no_directory_and_a_killed_run(cfg, pairs_file, tmp_path):
    from tasks.tracking.store import read_run, tracking_uri

    out = tmp_path / "rm"

    def stop(step, total, metrics):
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match=r"start again \(no state was saved yet\)"):
        RM.train_reward_model(cfg, pairs_file, out, epochs=1, on_step=stop)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri(cfg))
    exp = client.get_experiment_by_name("dapo-reward_model")
    runs = client.search_runs([exp.experiment_id])
    assert [read_run(x.info.run_id, tracking_uri(cfg))["status"] for x in runs] == ["KILLED"]


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_a_resumed_training_equals_the_uninterrupted_one(cfg, pairs_file, tmp_path):
    """Interrupted one step before the end (mid-epoch, after a checkpoint at the first epoch's
    end), then run again: the same weights, bit for bit, and the same MLflow run, FINISHED."""
    from tasks.tracking.store import read_run, tracking_uri

    args = dict(epochs=2, lr=1e-3, batch_size=8)
    whole = RM.train_reward_model(cfg, pairs_file, tmp_path / "a", track=False, **args)

    def stop(step, total, metrics):
        if step == total - 1 and "rm/loss" in metrics:
            raise KeyboardInterrupt

    out = tmp_path / "b"
    # it said "run the same command to start again", and the same command continues it
    with pytest.raises(TrainingInterrupted, match=r"to continue from its last saved state"):
        RM.train_reward_model(cfg, pairs_file, out, on_step=stop, **args)
    assert (tmp_path / ".b.resume" / "state.pt").exists() and not out.exists()
    resumed = RM.train_reward_model(cfg, pairs_file, out, **args)
    a, b = _weights(tmp_path / "a"), _weights(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.heldout_accuracy == whole.heldout_accuracy
    assert not (tmp_path / ".b.resume").exists()
    assert read_run(resumed.run_id, tracking_uri(cfg))["status"] == "FINISHED"
    with pytest.raises(TrainingInterrupted):  # other settings over an interrupted run: refused
        RM.train_reward_model(cfg, pairs_file, tmp_path / "c", on_step=stop, track=False, **args)
    with pytest.raises(PipelineError, match="other settings"):
        RM.train_reward_model(cfg, pairs_file, tmp_path / "c", track=False, epochs=3)
    # other pairs under the same file name (mined again): refused too, where it resumed the old
    # state on the new pairs and logged the old run's counts
    table = P.read_pairs(pairs_file)
    P.write_pairs(P.PairTable(table.rows[1:], table.provenance), pairs_file)
    with pytest.raises(PipelineError, match=r"other settings \(the pairs' content\)"):
        RM.train_reward_model(cfg, pairs_file, tmp_path / "c", track=False, **args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"epochs": 0},
            "--epochs 0 is out of range: it must be >= 1 (see `dapo reward-model train --help`)",
        ),
        ({"heldout": 1.0}, "--heldout 1.0 is out of range: it must be in (0, 1)"),
        ({"lr": -1.0}, "--lr -1.0 is out of range"),
        ({"lr": float("inf")}, "--lr inf is out of range"),
    ],
)
def test_bad_settings_are_one_line_errors(cfg, pairs_file, tmp_path, kwargs, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        RM.train_reward_model(cfg, pairs_file, tmp_path / "rm", track=False, **kwargs)
    assert not (tmp_path / "rm").exists()


def test_refuses_a_directory_with_files_and_too_few_pairs(cfg, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("keep me")
    one = str(P.write_pairs(P.PairTable(_rows(1), {}), tmp_path / "one.parquet"))
    with pytest.raises(PipelineError, match="already holds files"):
        RM.train_reward_model(cfg, one, full, track=False)
    assert (full / "x").read_text() == "keep me"
    # a trained model there (a run stopped right after saving it included): it is said so
    (full / "config.json").write_text("{}")
    with pytest.raises(PipelineError, match="already holds a trained model: use it, or choose"):
        RM.train_reward_model(cfg, one, full, track=False)
    with pytest.raises(PipelineError, match="too few"):
        RM.train_reward_model(cfg, one, tmp_path / "rm", track=False)


def test_a_directory_without_a_record_is_not_a_reward_model(tmp_path):
    with pytest.raises(PipelineError, match="not a reward model directory"):
        S.reward_model_record(tmp_path)


def test_a_diverged_training_stops_with_one_line_and_writes_no_model(cfg, pairs_file, tmp_path):
    """--lr 1e10 used to train on through a NaN loss and write a model of NaN weights, its MLflow
    run FINISHED; every command that loaded it then failed with a traceback."""
    with pytest.raises(PipelineError, match="training diverged at step .*Lower --lr"):
        RM.train_reward_model(cfg, pairs_file, tmp_path / "rm", track=False, lr=1e10)
    assert not (tmp_path / "rm" / "model.safetensors").exists()


def test_pairs_set_aside_are_said_when_training_reads_them(tiny_cfg, tmp_path, caplog):
    """A pairs JSONL with a torn line lost that line without a word (`dapo evaluate` reports
    its own such rows)."""
    import json
    import logging

    from tasks.preferences.common import read_split

    path = tmp_path / "pairs.jsonl"
    lines = [json.dumps(r) for r in _rows(40)] + ['{"prompt": "Compute 99 + 1.", "cho']
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.WARNING, logger="dapo"):
        table, train, held = read_split(tiny_cfg, str(path), 0.25, seed=0)
    assert len(train) + len(held) == 40
    assert "40 pairs; 1 rows set aside (1 lines that are not JSON objects)" in caplog.text


def test_train_refuses_a_missing_reward_model_before_it_samples_or_writes(tmp_path, monkeypatch):
    """It sampled the preflight first, then left config.json and untracked/ behind."""
    from typer.testing import CliRunner

    from flows import stages
    from flows.cli import app

    monkeypatch.setattr(stages, "preflight_task", lambda *a, **k: pytest.fail("it sampled"))

    run = tmp_path / "run"
    sets = ["-S", "rollout.reward=model", "-S", f"rollout.reward_model={tmp_path / 'rm'}"]
    out = CliRunner().invoke(app, ["train", *sets, "--run-dir", str(run), "--no-track"])
    assert out.exit_code == 2 and "no such reward model directory" in out.output, out.output
    assert not run.exists()
