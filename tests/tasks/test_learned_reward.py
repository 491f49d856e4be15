"""RL from a learned reward (rollout.reward: model): the reward model's scores replace Eq. 7 in
the advantages, dynamic sampling reads their spread, the rule's accuracy is still logged, and a
missing or mismatched reward model is a one-line error."""

import pytest
import torch

from dapo_core.config import ConfigError
from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from tasks.models import learned_reward as S
from tasks.preferences import pairs as P
from tasks.preferences import reward_model as RM
from tasks.training.batches import Group
from tasks.training.records import RolloutLog
from tasks.training.rollouts import _spread


@pytest.fixture(scope="module")
def reward_dir(tiny_cfg, tmp_path_factory):
    from tasks.data.splits import splits

    tmp = tmp_path_factory.mktemp("rm")
    rows = [
        {
            "prompt": p.prompt,
            "chosen": f"Answer: {p.answer}",
            "rejected": f"Answer: {int(p.answer) + 3}",
        }
        for p in splits(tiny_cfg).train
    ]
    pairs = str(P.write_pairs(P.PairTable(rows, {}), tmp / "pairs.parquet"))
    RM.train_reward_model(tiny_cfg, pairs, tmp / "rm", epochs=1, batch_size=16, track=False)
    return str(tmp / "rm")


def test_a_model_reward_needs_a_reward_model(tiny_cfg):
    with pytest.raises(ConfigError, match="rollout.reward_model"):
        resolve(tiny_cfg.to_dict(), overrides=["rollout.reward=model"])


def test_the_scores_drive_the_advantages_and_dynamic_sampling(tiny_cfg, reward_dir):
    from tasks.data.splits import splits
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.trainer import DAPOTrainer

    cfg = resolve(
        tiny_cfg.to_dict(), overrides=["rollout.reward=model", f"rollout.reward_model={reward_dir}"]
    )
    model, tok = load_policy(resolve_model_path(cfg), "float32", "cpu")
    t = DAPOTrainer(cfg, model, tok, None, splits(cfg).train)
    assert t.rollouts.reward_model is not None
    scores = t.rollouts.reward_model("1 + 2", ["Answer: 3", "Answer: 4", "3", "no idea"])
    assert len(scores) == 4 and len(set(scores)) > 1
    # every response correct by the rule: Eq. 7 gives no signal, the learned scores do
    g = Group(
        "p",
        "1",
        [5, 6, 7],
        [[8, 9], [10], [11, 12, 13], [14]],
        [True] * 4,
        [True] * 4,
        ["x"] * 4,
        scores=scores,
    )
    samples, _ = t.loss_samples([g])
    adv = torch.tensor([s.advantage for s in samples])
    assert adv.abs().sum() > 0
    assert (adv.argmax() == torch.tensor(scores).argmax()) and (
        adv.argmin() == torch.tensor(scores).argmin()
    )
    rule = Group("p", "1", g.prompt_ids, g.response_ids, g.finished, g.acc, g.texts)
    samples, _ = t.loss_samples([rule])
    assert all(s.advantage == 0 for s in samples)
    assert _spread(g) != [False] * 4 and any(_spread(g)) and not all(_spread(g))  # kept
    assert _spread(rule) == [True] * 4  # dropped by dynamic sampling: no signal


def test_training_logs_the_learned_reward_beside_the_rules_accuracy(tiny_cfg, reward_dir, tmp_path):
    from tasks.rundir import RunDir
    from tasks.training.run import run_training

    cfg = resolve(
        tiny_cfg.to_dict(),
        overrides=[
            "rollout.reward=model",
            f"rollout.reward_model={reward_dir}",
            "train.steps=2",
            "algo.overlong_shaping=false",  # so the rule's mean reward is exactly 2 acc - 1
        ],
    )
    result = run_training(cfg, RunDir(tmp_path / "run"), progress=False)
    assert result.steps == 2
    for row in result.history:
        assert 0 <= row["train/acc_mean"] <= 1
        # the reward model's scores, not the rule's +-1 (whose mean would be 2 acc - 1)
        assert row["train/reward_mean"] != pytest.approx(2 * row["train/acc_mean"] - 1)


def test_a_reward_model_of_another_tokenizer_is_refused(tiny_cfg, reward_dir):
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path

    _, tok = load_policy(resolve_model_path(tiny_cfg), "float32", "cpu")
    tok.add_tokens(["<another-token>"])
    with pytest.raises(PipelineError, match="tokenizer is not the policy's"):
        S.LearnedReward(reward_dir, tok, "cpu", 64)
    with pytest.raises(PipelineError, match="not a reward model directory"):
        S.LearnedReward(str(resolve_model_path(tiny_cfg)), tok, "cpu", 64)


def test_rl_scores_a_response_as_the_reward_model_was_trained_and_evaluated(tiny_cfg, reward_dir):
    """The sampler's ids end in EOS, the pairs' texts do not: scored from the ids, the head read
    a last token it never saw in training and ranked the policy's groups at chance. RL must
    read each response exactly as the trainer's held-out pairs are read."""
    from tasks.data.splits import splits
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.factory import make_generator
    from tasks.training.trainer import DAPOTrainer

    cfg = resolve(
        tiny_cfg.to_dict(),
        overrides=["rollout.reward=model", f"rollout.reward_model={reward_dir}"],
    )
    path = resolve_model_path(cfg)
    model, tok = load_policy(path, "float32", "cpu")
    problems = splits(cfg).train[:2]
    t = DAPOTrainer(cfg, model, tok, make_generator(cfg, model, tok, path), problems)
    groups = t.rollouts._sampled(problems, RolloutLog(), step=1)
    rm, rm_tok = S.load_reward_model(reward_dir, "cpu")
    max_len = cfg.rollout.max_prompt_len + cfg.rollout.max_response_len
    for p, g in zip(problems, groups, strict=True):
        assert any(r[-1] == tok.eos_token_id for r in g.response_ids)  # the case that broke
        rows = [{"prompt": p.prompt, "chosen": y, "rejected": y} for y in g.texts]
        trained_as = S.rewards(
            rm, [c for c, _ in RM.encode(rm_tok, rows, max_len)], tok.pad_token_id
        )
        assert g.scores == pytest.approx(trained_as.tolist(), abs=1e-5)


def test_the_stall_watch_reads_the_scores_under_a_learned_reward():
    from tasks.training.records import RolloutLog
    from tasks.training.step_metrics import StallWatch

    wrong = dict(acc=[False] * 4, lengths=[2] * 4, finished=[True] * 4, parsed=[True] * 4)
    watch = StallWatch(limit=1, group_size=4)
    watch.observe(RolloutLog(**wrong, scores=[0.1, 0.5, 0.2, 0.1]), step=1)  # all wrong, scored
    assert watch.count == 0
    with pytest.raises(Exception, match="scores are equal"):
        watch.observe(RolloutLog(**wrong, scores=[0.3] * 4), step=2)
    with pytest.raises(Exception, match="nothing to learn"):
        StallWatch(limit=1, group_size=4).observe(RolloutLog(**wrong), step=1)  # the rule
