"""Offline DPO: log 2 at the start (the policy is its reference), the held-out loss falls with
training, the policy is saved as a model directory; bad input and interrupts leave nothing."""

import json
import math
from pathlib import Path

import pytest
import torch

from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError, TrainingInterrupted
from dapo_core.preferences import dpo_loss
from tasks.preferences import dpo as D
from tasks.preferences import pairs as P


@pytest.fixture
def cfg(tiny_cfg, tmp_path):
    return resolve(
        tiny_cfg.to_dict(), overrides=[f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db"]
    )


@pytest.fixture
def pairs_file(tiny_cfg, tmp_path):
    from tasks.data.splits import splits

    rows = [
        {
            "prompt": p.prompt,
            "chosen": f"Answer: {p.answer}",
            "rejected": f"Answer: {int(p.answer) + 3}",
        }
        for p in splits(tiny_cfg).train
    ]
    return str(P.write_pairs(P.PairTable(rows, {}), tmp_path / "pairs.parquet"))


def test_the_policy_against_its_frozen_copy_gives_log_2(cfg, pairs_file):
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.forward import PolicyForward
    from tasks.training.reference import frozen_copy

    model, tok = load_policy(resolve_model_path(cfg), "float32", "cpu")
    pairs = D.pair_samples(tok, P.read_pairs(pairs_file).rows[:6], 8)
    flat = [x for pair in pairs for x in pair]
    pol = D.sequence_logps(PolicyForward(model, tok.pad_token_id, 1.0, False), flat).view(-1, 2)
    ref = D.sequence_logps(
        PolicyForward(frozen_copy(model), tok.pad_token_id, 1.0, False), flat
    ).view(-1, 2)
    assert torch.equal(pol, ref) and (pol < 0).all()
    loss, m = dpo_loss(pol[:, 0], pol[:, 1], ref[:, 0], ref[:, 1], beta=0.1)
    assert float(loss) == pytest.approx(math.log(2), abs=1e-7)
    assert float(m["pair_accuracy"][0]) == 0  # a margin of 0 is not a win


def test_training_lowers_the_heldout_loss_and_saves_a_policy(cfg, pairs_file, tmp_path):
    from tasks.models.loading import load_policy
    from tasks.tracking.store import read_run, tracking_uri

    out = tmp_path / "dpo"
    r = D.train_dpo(cfg, pairs_file, out, beta=0.5, nll_weight=0.0, epochs=2, lr=3e-3, batch_size=8)
    assert r.heldout_loss < math.log(2) - 0.005  # log 2 at the start (the test above)
    model, _ = load_policy(str(out), "float32", "cpu")  # an ordinary model directory
    assert model.config.model_type == "qwen2"
    run = read_run(r.run_id, tracking_uri(cfg))
    assert run["status"] == "FINISHED" and run["experiment"].endswith("dpo")
    assert run["metrics"]["dpo/heldout_loss"] == pytest.approx(r.heldout_loss)


def test_an_interrupted_dpo_resumes_to_the_uninterrupted_policy(cfg, pairs_file, tmp_path):
    from safetensors.torch import load_file

    args = dict(epochs=2, lr=3e-3, batch_size=8, track=False)
    D.train_dpo(cfg, pairs_file, tmp_path / "a", **args)

    def stop(step, total, metrics):
        if step == total - 1 and "dpo/loss" in metrics:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        D.train_dpo(cfg, pairs_file, tmp_path / "b", on_step=stop, **args)
    assert not (tmp_path / "b").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    D.train_dpo(cfg, pairs_file, tmp_path / "b", **args)
    a, b = (load_file(str(tmp_path / d / "model.safetensors")) for d in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / ".b.resume").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.0}, "--beta 0.0 is out of range"),
        ({"beta": float("inf")}, "--beta inf is out of range"),
        ({"nll_weight": -1.0}, "--nll-weight -1.0"),
    ],
)
def test_bad_settings_are_one_line_errors(cfg, pairs_file, tmp_path, kwargs, message):
    with pytest.raises(PipelineError, match=message):
        D.train_dpo(cfg, pairs_file, tmp_path / "dpo", track=False, **kwargs)
    assert not (tmp_path / "dpo").exists()


@pytest.mark.parametrize("out", ["afile", "afile/dpo"])
def test_an_out_where_a_file_is_is_one_line(cfg, pairs_file, tmp_path, out):
    (tmp_path / "afile").write_text("")
    with pytest.raises(PipelineError, match=f"{tmp_path / 'afile'} is a file; name a directory"):
        D.train_dpo(cfg, pairs_file, tmp_path / out, track=False)


def _length_parity(response: str, answer: str):
    """The rule for mining in these tests: the tiny policy is never right, so its groups would
    give no pairs; its responses' lengths differ, so these groups are mixed."""
    from dapo_core.reward import Score

    right = len(response) % 2 == 1
    return Score(1.0 if right else -1.0, right, None)


@pytest.mark.slow
def test_iterative_dpo_mines_each_round_from_the_policy_before(
    cfg, pairs_file, tmp_path, monkeypatch
):
    from safetensors.torch import load_file

    monkeypatch.setattr(P, "score", _length_parity)
    mined_from = []
    mine = P.mine_to_file

    def spy(round_cfg, *args, **kwargs):
        mined_from.append(round_cfg.model.name_or_path)
        return mine(round_cfg, *args, **kwargs)

    monkeypatch.setattr(P, "mine_to_file", spy)
    args = dict(epochs=1, lr=3e-3, batch_size=8, track=False, prompts=40)
    said = []
    r = D.train_iterative_dpo(
        cfg, pairs_file, tmp_path / "a", 3, on_round=lambda n, s: said.append(n), **args
    )
    assert r.out_dir == tmp_path / "a" and (tmp_path / "a" / "model.safetensors").exists()
    assert [Path(m).name for m in mined_from] == ["round1", "round2"]  # the policy before
    assert said == [1, 2, 2, 3, 3]  # round 1 trained; rounds 2 and 3 mined, then trained
    record = json.loads((tmp_path / "a" / D.RECORD).read_text())
    assert record["rounds"] == 3 and record["base_model"] == cfg.model.name_or_path
    assert not (tmp_path / ".a.rounds").exists()  # the rounds' work is removed
    one = D.train_iterative_dpo(cfg, pairs_file, tmp_path / "one", 1, **args)
    a, b = (load_file(str(d / "model.safetensors")) for d in (r.out_dir, one.out_dir))
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the later rounds trained it further

    def stop(step, total, metrics):  # in the second round's training
        if len(mined_from) == 3 and "dpo/loss" in metrics:
            raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted):
        D.train_iterative_dpo(cfg, pairs_file, tmp_path / "b", 3, on_step=stop, **args)
    assert not (tmp_path / "b").exists() and (tmp_path / ".b.rounds" / "round1").exists()
    with pytest.raises(PipelineError, match="rounds of an interrupted run with other settings"):
        D.train_iterative_dpo(cfg, pairs_file, tmp_path / "b", 3, **(args | {"lr": 1e-3}))
    assert len(mined_from) == 3  # refused before any round ran
    D.train_iterative_dpo(cfg, pairs_file, tmp_path / "b", 3, **args)
    assert len(mined_from) == 4  # round 2's pairs were kept; round 3 mined once
    b = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # resumed to the uninterrupted policy


def test_iterative_dpo_refuses_zero_rounds(cfg, pairs_file, tmp_path):
    with pytest.raises(PipelineError, match="--rounds 0 is out of range"):
        D.train_iterative_dpo(cfg, pairs_file, tmp_path / "dpo", 0, track=False)
    assert not (tmp_path / "dpo").exists()


def test_a_state_saved_before_the_pairs_digest_existed_still_resumes(tmp_path):
    """Interrupted trainings saved before the pairs' content was part of their settings were
    refused as "other settings (the pairs' content)", their work lost."""
    import json

    from tasks.preferences.common import Resume

    old = Resume(tmp_path / "out", {"lr": 1e-3})
    old.save({"step": 7})
    now = Resume(tmp_path / "out", {"lr": 1e-3, "pairs_digest": "abc"})
    assert now.load() == {"step": 7}
    settings = json.loads((old.dir / "settings.json").read_text())
    assert settings == {"lr": 1e-3}  # read as it was; saved again with the digest later


@pytest.mark.parametrize("damaged", ["state.pt", "settings.json"])
def test_an_unreadable_interrupted_state_is_one_line(tmp_path, damaged):
    from tasks.preferences.common import Resume

    resume = Resume(tmp_path / "out", {"lr": 1e-3})
    resume.save({"step": torch.tensor(3)})
    assert int(resume.load()["step"]) == 3
    whole = (resume.dir / damaged).read_bytes()
    (resume.dir / damaged).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(PipelineError, match=r"\.out\.resume holds .* cannot be read .*: remove"):
        resume.load()


def test_iterative_dpo_names_each_rounds_run_after_the_directory_they_end_in(
    cfg, pairs_file, tmp_path, monkeypatch
):
    """The rounds' MLflow runs were "dpo round1", "dpo round2", tagged with their own
    directories, which are removed once the rounds are over: no run named the result."""
    trained = []

    def train(round_cfg, pairs, model_dir, **kwargs):
        trained.append((kwargs["run_name"], kwargs["extra_tags"]))
        model_dir.mkdir(parents=True)
        (model_dir / D.RECORD).write_text(json.dumps({"heldout_accuracy": 1, "heldout_loss": 0}))
        return D.DPOResult(model_dir, 1.0, 0.0, 1, 1, 1)

    monkeypatch.setattr(D, "train_dpo", train)
    monkeypatch.setattr(P, "mine_to_file", lambda *a, **k: (P.PairTable([], {}), None, None))
    D.train_iterative_dpo(cfg, pairs_file, tmp_path / "pol", 2, track=False)
    out = str(tmp_path / "pol")
    assert trained == [
        ("dpo pol round 1 of 2", {"dpo.rounds_of": out, "dpo.round": "1 of 2"}),
        ("dpo pol round 2 of 2", {"dpo.rounds_of": out, "dpo.round": "2 of 2"}),
    ]
    # a caller's own name and tags go with the rounds' (they were passed twice: a TypeError)
    trained.clear()
    own = dict(run_name="sweep dpo", extra_tags={"sweep": "s1"})
    D.train_iterative_dpo(cfg, pairs_file, tmp_path / "pol2", 2, track=False, **own)
    assert trained[1] == (
        "sweep dpo round 2 of 2",
        {"sweep": "s1", "dpo.rounds_of": str(tmp_path / "pol2"), "dpo.round": "2 of 2"},
    )
