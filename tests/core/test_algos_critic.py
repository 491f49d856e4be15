"""The critic's clipped value loss and explained variance (dapo_core.algos.critic): by hand,
against verl's formula, and its configuration (a critic exactly when the advantage reads one)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.algos import CRITICS, aggregate, explained_variance, reduce_metrics
from dapo_core.algos.critic import ValueParams, value_loss
from dapo_core.config import ConfigError

F64 = torch.float64


def _loss_and_grad(values, old, returns, mask, eps=0.5):
    v = torch.tensor(values, dtype=F64, requires_grad=True)
    loss_t, metrics = value_loss(
        v,
        torch.tensor(old, dtype=F64),
        torch.tensor(returns, dtype=F64),
        torch.tensor(mask),
        ValueParams(cliprange_value=eps),
    )
    loss = aggregate("token_mean", None, loss_t, torch.tensor(mask))  # verl's token-mean
    loss.backward()
    return loss_t.detach(), loss.detach(), v.grad, reduce_metrics([metrics])


def test_clipped_value_loss_by_hand():
    # eps 0.5; l = 0.5 max((V - R)^2, (clip(V, V_old - 0.5, V_old + 0.5) - R)^2)
    # t0: V 1, V_old 0.8, R 0: inside the range, clip(V) = V: l = 0.5, dl/dV = V - R = 1
    # t1: V 2, V_old 0.5, R 0: clip(V) = 1; (2 - 0)^2 = 4 > (1 - 0)^2 = 1: l = 2, dl/dV = 2
    # t2: V 2, V_old 0.5, R 3: clip(V) = 1; (1 - 3)^2 = 4 > (2 - 3)^2 = 1: l = 2 from the
    #     clipped term, a constant: dl/dV = 0 (the one token counted in value_clip_frac)
    # t3: V -1, V_old 0, R 1: clip(V) = -0.5; 4 > 2.25: l = 2, dl/dV = V - R = -2
    # t4: padding (V 5, R -7): 0, no gradient
    loss_t, loss, grad, m = _loss_and_grad(
        [[1.0, 2.0, 2.0, -1.0, 5.0]],
        [[0.8, 0.5, 0.5, 0.0, 0.0]],
        [[0.0, 0.0, 3.0, 1.0, -7.0]],
        [[True, True, True, True, False]],
    )
    torch.testing.assert_close(loss_t, torch.tensor([[0.5, 2.0, 2.0, 2.0, 0.0]], dtype=F64))
    # token mean over the 4 valid tokens: (0.5 + 2 + 2 + 2) / 4 = 1.625, each gradient / 4
    assert loss.item() == pytest.approx(1.625)
    torch.testing.assert_close(grad, torch.tensor([[0.25, 0.5, 0.0, -0.5, 0.0]], dtype=F64))
    assert m["value_loss"].item() == pytest.approx(1.625)
    assert m["value_clip_frac"].item() == pytest.approx(1 / 4)


def test_a_wider_clip_range_releases_the_clipped_token():
    # t2 above with eps 2: clip(V) = V, l = 0.5 (2 - 3)^2 = 0.5, dl/dV = V - R = -1
    loss_t, _, grad, m = _loss_and_grad([[2.0]], [[0.5]], [[3.0]], [[True]], eps=2.0)
    assert loss_t.item() == 0.5 and grad.item() == -1.0 and m["value_clip_frac"].item() == 0


def _verl_compute_value_loss(vpreds, returns, values, mask, cliprange_value):
    """verl ``trainer/ppo/core_algos.py`` ``compute_value_loss`` (token-mean), transcribed:
    vpredclipped = clip_by_value(vpreds, values - c, values + c); vf_loss = 0.5 *
    masked_mean(max((vpreds - R)^2, (vpredclipped - R)^2)); vf_clipfrac = masked_mean(l2 > l1)."""
    vpredclipped = torch.max(torch.min(vpreds, values + cliprange_value), values - cliprange_value)
    vf_losses1 = (vpreds - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    m = mask.to(vpreds.dtype)
    vf_loss = 0.5 * (torch.max(vf_losses1, vf_losses2) * m).sum() / m.sum()
    vf_clipfrac = ((vf_losses2 > vf_losses1).to(m.dtype) * m).sum() / m.sum()
    return vf_loss, vf_clipfrac


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 4),
    t=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    eps=st.floats(0.05, 2.0),
)
def test_value_loss_is_verls(b, t, seed, eps):
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(b, t, generator=g, dtype=F64)
    old = values + torch.randn(b, t, generator=g, dtype=F64)
    returns = torch.randn(b, t, generator=g, dtype=F64)
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[0, 0] = True
    ours_v = values.clone().requires_grad_()
    loss_t, metrics = value_loss(ours_v, old, returns, mask, ValueParams(cliprange_value=eps))
    ours = aggregate("token_mean", None, loss_t, mask)
    ours.backward()
    theirs_v = values.clone().requires_grad_()
    vf_loss, clipfrac = _verl_compute_value_loss(theirs_v, returns, old, mask, eps)
    vf_loss.backward()
    torch.testing.assert_close(ours, vf_loss)
    torch.testing.assert_close(ours_v.grad, theirs_v.grad)
    assert reduce_metrics([metrics])["value_clip_frac"].item() == pytest.approx(clipfrac.item())


def test_explained_variance_by_hand():
    returns = torch.tensor([[1.0, -1.0, 1.0], [-1.0, 9.0, 9.0]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, False, False]])

    def ev(values):
        return reduce_metrics([explained_variance(values, returns, mask)])["explained_variance"]

    # Var(R) = 1 over the 4 valid tokens; V = R / 2: R - V = R / 2, Var 1/4: EV = 3/4
    assert ev(returns / 2).item() == pytest.approx(0.75)
    assert ev(returns).item() == pytest.approx(1.0)  # a perfect critic
    assert ev(torch.zeros_like(returns)).item() == pytest.approx(0.0)  # no better than the mean
    assert ev(-returns).item() == pytest.approx(-3.0)  # Var(2R) = 4: worse than the mean
    # constant returns: nothing to explain, 0 (not NaN)
    flat = {"explained_variance": explained_variance(returns, torch.ones_like(returns), mask)}
    assert reduce_metrics(flat.values())["explained_variance"].item() == 0.0


def test_critic_entry_validation_and_defaults():
    p = CRITICS.make_params("value", {})
    assert p == ValueParams(0.5, None, None, None, "policy")  # verl's clip; null: train.*
    with pytest.raises(ConfigError, match=r"algo.critic value: unknown parameter 'clip'"):
        CRITICS.make_params("value", {"clip": 0.2})


def test_gae_without_a_critic_is_one_line_at_config_load():
    from dapo_core.ablation import apply_variant
    from tasks.params import load_params

    with pytest.raises(ConfigError) as err:
        load_params(overrides=['algo.advantage={"name": "gae"}'])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("override -S algo.advantage=")
    assert "algo.advantage gae needs a critic's values" in msg
    with pytest.raises(ConfigError, match=r"algo.critic value: algo.advantage grpo does not read"):
        load_params(overrides=['algo.critic={"name": "value"}'])
    with pytest.raises(ConfigError, match=r"algo.critic none: takes no parameters"):
        load_params(overrides=['algo.critic={"name": "none", "lr": 1}'])
    both = ['algo.advantage={"name": "gae"}', 'algo.critic={"name": "value", "lr": 1e-4}']
    cfg = load_params(overrides=both)
    assert cfg.algo.critic == {
        "name": "value",
        "cliprange_value": 0.5,
        "lr": 1e-4,
        "weight_decay": None,
        "grad_clip": None,
        "model": "policy",
    }
    # a preset that replaces the advantage takes the critic with it
    assert apply_variant(cfg, "rloo").algo.critic == {"name": "none"}
    assert apply_variant(cfg, "gspo").algo.critic == cfg.algo.critic  # keeps gae and its critic


def test_a_presets_entries_are_tuned_with_overrides_after_it():
    """``--variant ppo -S algo.critic.lr=1e-5``: the preset chooses the critic, the override sets
    its learning rate (before, the preset replaced the entry and the override failed on the
    base config's ``none`` critic, which takes no parameters)."""
    from dapo_core.ablation import apply_variant, split_overrides
    from tasks.params import load_params

    sets = ["algo.critic.lr=1e-5", "train.lr=2e-4", "algo.loss.eps_high=0.3"]
    base, tuned = split_overrides("ppo", sets)
    assert base == ["train.lr=2e-4"]
    assert tuned == ["algo.critic.lr=1e-5", "algo.loss.eps_high=0.3"]  # ppo chooses both
    cfg = apply_variant(load_params(overrides=base), "ppo", tuned)
    assert cfg.algo.critic["name"] == "value" and cfg.algo.critic["lr"] == 1e-5
    assert cfg.train.lr == 2e-4 and cfg.algo.loss["eps_high"] == 0.3
    assert cfg.algo.advantage["name"] == "gae"
    with pytest.raises(ConfigError, match=r"--variant ppo chooses algo.critic: drop -S"):
        split_overrides("ppo", ["algo.critic.name=none"])
    _, bad = split_overrides("ppo", ["algo.critic.lrr=1"])
    with pytest.raises(ConfigError, match=r"override -S algo.critic.lrr=1: .*did you mean 'lr'"):
        apply_variant(load_params(), "ppo", bad)
    assert split_overrides("+clip_higher", sets) == (sets, [])  # a rung chooses no entry


def test_an_entry_parameter_the_config_does_not_name_is_set_by_override():
    cfg = load_params_with(["algo.kl.name=k3", "algo.kl.where=reward"])
    assert cfg.algo.kl["where"] == "reward" and cfg.algo.kl["name"] == "k3"
    with pytest.raises(ConfigError, match=r"^override -S algo.kl.bogus=1: algo.kl: unknown"):
        load_params_with(["algo.kl.name=k3", "algo.kl.bogus=1"])
    with pytest.raises(ConfigError, match=r"unknown key 'algo.nokey'"):
        load_params_with(["algo.nokey=1"])


def load_params_with(overrides: list[str]):
    from tasks.params import load_params

    return load_params(overrides=overrides)


def test_a_sweep_tunes_each_presets_entries_and_leaves_the_others():
    """``dapo ablate --variants dapo,ppo,gspo -S algo.critic.lr=1e-5 -S algo.loss.eps_high=1e-3
    -S train.lr=2e-4``: ppo's critic and the losses ppo and gspo choose are tuned after their
    presets; dapo (which chooses no entry) keeps the config's; train.lr is everyone's."""
    from dapo_core.ablation import apply_variant, split_sweep_overrides
    from tasks.params import load_params

    sets = ["algo.critic.lr=1e-5", "algo.loss.eps_high=1e-3", "train.lr=2e-4"]
    base, tuned = split_sweep_overrides(["dapo", "ppo", "gspo", "grpo"], sets)
    assert base == ["train.lr=2e-4"]
    assert tuned == {
        "dapo": [],
        "ppo": ["algo.critic.lr=1e-5", "algo.loss.eps_high=1e-3"],
        "gspo": ["algo.loss.eps_high=1e-3"],
        "grpo": [],  # a Table 1 rung chooses no entry
    }
    cfg = load_params(overrides=base)
    dapo, ppo, gspo = (apply_variant(cfg, v, tuned[v]) for v in ("dapo", "ppo", "gspo"))
    assert dapo.algo.loss["eps_high"] == cfg.algo.loss["eps_high"] != 1e-3
    assert ppo.algo.critic["lr"] == 1e-5 and ppo.algo.loss["eps_high"] == 1e-3
    assert gspo.algo.loss == {"name": "gspo", "eps_low": 3e-4, "eps_high": 1e-3}
    assert {c.train.lr for c in (dapo, ppo, gspo)} == {2e-4}
