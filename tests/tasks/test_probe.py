"""The switch probe (tasks.training.probe): an observer of the run, whose flipped side is exactly
the update a run with the switch flipped would make."""

import pytest
import torch

from dapo_core.ablation import apply_variant
from dapo_core.config_loader import resolve
from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator
from tasks.training.probe import mean_entropy
from tasks.training.trainer import DAPOTrainer


def _trainer(cfg, dtype="float32"):
    model, tok = load_policy(resolve_model_path(cfg), dtype)
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    # The fixture's model writes no answers yet: reward by length parity, so groups are mixed.
    return DAPOTrainer(
        cfg, model, tok, gen, splits(cfg).train, reward_fn=lambda r, _: len(r) % 2 == 0
    )


def _cfg(tiny_cfg, clip_higher, probe=None, *overrides):
    """GRPO (no overlong filtering: the fixture's responses are mostly truncated) with
    clip-higher on or off; at full lr from the first step, so that the second update of a step
    moves tokens past the clip and the switch has something to act on."""
    grpo = apply_variant(tiny_cfg, "grpo")
    sets = [f"algo.clip_higher={clip_higher}", "train.warmup_steps=1"]
    sets += [f"tracking.switch_probe={probe or 'null'}", *overrides]
    return resolve(grpo.to_dict(), overrides=sets)


def _recording(t):
    """Record the samples of each step's real updates (the call made with the run's loss)."""
    seen, real = [], t.updater.updates

    def updates(samples, alg=None):
        if alg is None:
            seen.append(samples)
        return real(samples, alg)

    t.updater.updates = updates
    return seen


def _same(a, b) -> bool:
    """Nested state (dicts, lists, tensors) equal, bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _train_metrics(m):
    return {k: v for k, v in m.items() if k.startswith("train/")}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bf16: through float32 masters
def test_a_probed_run_is_the_same_run(tiny_cfg, dtype):
    plain = _trainer(_cfg(tiny_cfg, "true"), dtype)
    probed = _trainer(_cfg(tiny_cfg, "true", "clip_higher"), dtype)
    start = {k: v.clone() for k, v in plain.model.state_dict().items()}
    deltas = []
    for _ in range(3):
        a, b = plain.train_step().metrics, probed.train_step().metrics
        assert _train_metrics(a) == _train_metrics(b)
        assert not any(k.startswith("probe/") for k in a)
        deltas.append(b["probe/entropy_delta"])
    assert any(d != 0.0 for d in deltas)  # the flipped updates differed, and were undone
    wa, wb = plain.model.state_dict(), probed.model.state_dict()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _same(plain.engine.state_dict(), probed.engine.state_dict())  # optimizer state too
    assert any(not torch.equal(wa[k], start[k]) for k in wa)  # the run did train


@pytest.mark.slow
def test_a_probed_ppo_run_is_the_same_run_critic_included(tiny_cfg):
    """With a critic (PPO): the probe's flipped update reads the critic's values but neither
    updates nor keeps anything of it; the run, its critic and their optimizers are unchanged."""
    sets = ["train.warmup_steps=1", "algo.overlong_filtering=false"]
    base = apply_variant(resolve(tiny_cfg.to_dict(), overrides=sets), "ppo")
    probed_cfg = resolve(base.to_dict(), overrides=["tracking.switch_probe=clip_higher"])
    plain, probed = _trainer(base), _trainer(probed_cfg)
    for _ in range(2):
        a, b = plain.train_step().metrics, probed.train_step().metrics
        assert _train_metrics(a) == _train_metrics(b)
        assert "train/value_loss" in a and "probe/entropy_delta" in b
    for x, y in ((plain.model, probed.model), (plain.critic.model, probed.critic.model)):
        wa, wb = x.state_dict(), y.state_dict()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert _same(plain.critic.engine.state_dict(), probed.critic.engine.state_dict())


def test_the_flipped_update_is_the_other_rungs_update(tiny_cfg):
    """A run with clip-higher, probed on it: its "off" side is what a run without the switch
    reaches from the same state and batch, its "on" side the run's own update."""
    on = _trainer(_cfg(tiny_cfg, "true", "clip_higher"))
    off = _trainer(_cfg(tiny_cfg, "false"))
    seen_on, seen_off = _recording(on), _recording(off)
    m = on.train_step().metrics
    off.train_step()
    (batch,) = seen_on
    assert [s.input_ids for s in batch] == [s.input_ids for s in seen_off[0]]  # same rollouts
    assert m["probe/entropy_on"] == pytest.approx(
        mean_entropy(on.updater.forward, batch, 64), abs=1e-7
    )
    assert m["probe/entropy_off"] == pytest.approx(
        mean_entropy(off.updater.forward, batch, 64), abs=1e-7
    )
    assert m["probe/entropy_delta"] == pytest.approx(m["probe/entropy_on"] - m["probe/entropy_off"])
    assert m["probe/entropy_delta"] != 0.0  # the switch acted in this step
    assert m["train/clip_frac_high"] > 0.0


@pytest.mark.slow
def test_a_switch_that_changes_nothing_probes_to_zero(tiny_cfg):
    """With eps_high = eps_low, clip-higher on and off are the same loss: the same update."""
    t = _trainer(
        _cfg(tiny_cfg, "true", "clip_higher", "algo.loss.eps_high=0.2", "algo.loss.eps_low=0.2")
    )
    for _ in range(2):
        m = t.train_step().metrics
        assert m["probe/entropy_delta"] == 0.0
        assert m["probe/entropy_on"] != m["probe/entropy_before"]  # an update happened


def test_a_probe_on_several_ranks_is_refused_in_one_line():
    from dapo_core.errors import PipelineError
    from tasks.training.probe import check_world

    check_world("clip_higher", 1)
    check_world(None, 8)
    with pytest.raises(PipelineError, match="runs on one process"):
        check_world("clip_higher", 2)
