"""KL to a frozen reference policy in the trainer (``algo.kl``): the reference never trains, the
KL term starts at exactly 0 and grows, it survives resume, and when off nothing changes."""

import dataclasses
import math

import pytest
import torch
from trainer_factory import full_and_resumed, parity_scores, parity_trainer, without_timings

from dapo_core.ablation import apply_variant
from dapo_core.config_loader import resolve
from tasks.training.batches import Sample

# One update per step (mini_batch = prompt_batch): step 1's update starts from pi_ref itself.
ONE_UPDATE = ["train.mini_batch=4", "train.warmup_steps=1"]


def _cfg(tiny_cfg, *overrides, variant=None):
    cfg = resolve(tiny_cfg.to_dict(), overrides=[*ONE_UPDATE, *overrides])
    return apply_variant(cfg, variant) if variant else cfg


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_kl_term_keeps_a_sample_of_zero_advantage_in_the_loss():
    s = Sample([1, 2, 3], 1, 0.0, True, token_advantages=torch.zeros(2))
    assert not s.carries_loss  # nothing to learn: skipped without a KL term
    s = dataclasses.replace(s, kl=True)
    assert s.carries_loss  # the KL term still pulls it toward pi_ref
    s = dataclasses.replace(s, keep=False)
    assert not s.carries_loss  # overlong-filtered: no loss at all


@pytest.mark.slow
def test_kl_in_the_loss_starts_at_zero_grows_and_never_moves_the_reference(tiny_cfg):
    cfg = _cfg(tiny_cfg, variant="grpo_kl")
    t = parity_trainer(cfg)
    ref = t.reference.model
    assert ref is not t.model and not ref.training
    assert not any(p.requires_grad for p in ref.parameters())
    assert next(ref.parameters()).dtype == next(t.model.parameters()).dtype
    start = _state(ref)
    assert all(torch.equal(start[k], v) for k, v in _state(t.model).items())  # pi_ref = pi_0
    kls = [t.train_step().metrics["train/kl_mean"] for _ in range(3)]
    # the first update's policy is pi_ref: the same forward on the same weights, k3 exactly 0
    assert kls[0] == 0.0
    assert kls[1] > 0 and kls[2] > 0
    assert all(torch.equal(start[k], v) for k, v in _state(ref).items())  # frozen
    assert any(not torch.equal(start[k], v) for k, v in _state(t.model).items())  # trained


@pytest.mark.slow
def test_the_kl_term_changes_the_update(tiny_cfg):
    """Same batches, same first update (KL 0, and k3's gradient is 0 there); from the second
    update on, the policy with the KL term is pulled back toward pi_ref."""
    runs = {}
    for name, kl in (("off", '{"name": "none"}'), ("on", '{"name": "k3", "beta": 1.0}')):
        t = parity_trainer(_cfg(tiny_cfg, "algo.dynamic_sampling=false", f"algo.kl={kl}"))
        before = _state(t.model)
        t.train_step()
        first = _state(t.model)
        t.train_step()
        runs[name] = (before, first, _state(t.model))
    (_, f0, s0), (_, f1, s1) = runs["off"], runs["on"]
    for k in f0:  # the first update: KL's gradient is 0 (only the micro-batches differ)
        torch.testing.assert_close(f1[k], f0[k], rtol=1e-5, atol=1e-7)
    assert any(not torch.equal(s0[k], s1[k]) for k in s0)
    # pulled toward pi_ref: the weights moved less far from pi_0 in total
    dist = {n: sum(((s[k] - b[k]) ** 2).sum() for k in s) for n, (b, _, s) in runs.items()}
    assert dist["on"] < dist["off"]


@pytest.mark.slow
def test_kl_off_or_beta_zero_builds_no_reference_and_trains_the_same(tiny_cfg):
    """No copy, no reference forward: ``beta = 0`` is ``none``, bit for bit."""
    out = {}
    for kl in ('{"name": "none"}', '{"name": "k3", "beta": 0}'):
        t = parity_trainer(_cfg(tiny_cfg, "algo.dynamic_sampling=false", f"algo.kl={kl}"))
        assert t.reference is None and "kl_mean" not in t.metric_names
        metrics = [t.train_step().metrics for _ in range(2)]
        train = [{k: v for k, v in m.items() if k.startswith("train/")} for m in metrics]
        out[kl] = (train, _state(t.model))
    (m0, w0), (m1, w1) = out.values()
    assert m0 == m1 and all(torch.equal(w0[k], w1[k]) for k in w0)
    assert "train/kl_mean" not in m0[0]


@pytest.mark.slow
def test_kl_in_the_reward_is_measured_before_the_advantages(tiny_cfg):
    """The penalty -beta k2 enters the rewards: logged with them, 0 while pi_old = pi_ref."""
    t = parity_trainer(
        _cfg(
            tiny_cfg,
            "algo.dynamic_sampling=false",
            'algo.kl={"name": "k2", "beta": 0.5, "where": "reward"}',
        )
    )
    assert t.reference is not None and "kl_mean" not in t.metric_names  # not a loss metric
    kls = [t.train_step().metrics["train/kl_mean"] for _ in range(2)]
    assert kls[0] == 0.0 and kls[1] > 0
    assert math.isfinite(t.train_step().metrics["train/loss"])


@pytest.mark.slow
def test_resume_with_kl_reproduces_the_uninterrupted_run(tiny_cfg, tmp_path, monkeypatch):
    """pi_ref is rebuilt from the run's starting model, not the checkpoint: a resumed run's KL
    (to pi_0, > 0 by then) and weights are the uninterrupted run's, exactly."""
    parity_scores(monkeypatch)  # mixed groups from step 1
    cfg = _cfg(tiny_cfg, "train.steps=4", variant="grpo_kl")
    full, rest = full_and_resumed(cfg, tmp_path)
    assert without_timings(rest.history) == without_timings(full.history)
    assert full.history[0]["train/kl_mean"] == 0.0 and full.history[2]["train/kl_mean"] > 0
    from safetensors.torch import load_file

    wa = load_file(str(tmp_path / "full" / "final" / "model.safetensors"))
    wb = load_file(str(tmp_path / "cut" / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_a_padding_micro_batch_adds_no_kl_gradient(tiny_cfg):
    """A rank with fewer micro-batches runs empty ones (a one-token dummy) to keep ZeRO-3's
    collectives in step; with k1, whose gradient is beta on every token it counts whatever
    pi_ref says, the dummy must still add nothing."""
    cfg = _cfg(tiny_cfg, "algo.dynamic_sampling=false", 'algo.kl={"name": "k1", "beta": 0.1}')
    out = []
    for pad in (0, 2):
        t = parity_trainer(cfg)
        mine = t.updater.micro_batches
        t.updater.micro_batches = lambda s, mine=mine, pad=pad: mine(s) + [[] for _ in range(pad)]
        metrics = t.train_step().metrics
        out.append(({k: v for k, v in metrics.items() if k.startswith("train/")}, _state(t.model)))
    (m0, w0), (m1, w1) = out
    assert m0 == m1 and all(torch.equal(w0[k], w1[k]) for k in w0)
