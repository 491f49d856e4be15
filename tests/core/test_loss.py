"""Eq. 10/12 by hand, the clip fractions, and chunking invariance under a global normalizer."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.config import LossConfig
from dapo_core.loss import aggregate, effective_eps_high, per_token_loss, policy_loss

DAPO = LossConfig(eps_low=0.2, eps_high=0.28, clip_higher=True, token_level_loss=True)
GRPO = LossConfig(eps_low=0.2, eps_high=0.28, clip_higher=False, token_level_loss=False)


def _logp_for_ratio(r: float) -> float:
    return math.log(r)


def test_per_token_loss_hand_computed():
    # r = 1.5, A = +1 -> clipped at 1.28: max(-1.5, -1.28) = -1.28
    # r = 0.5, A = -1 -> max(0.5, 0.8) = 0.8 (clip at 1 - 0.2)
    # r = 1.1, A = +2 -> inside the range: -2.2
    # r = 1.5, A = -1 -> max(1.5, 1.28) = 1.5 (no clipping for A<0 above the range: PPO pessimism)
    ratios = torch.tensor([[1.5, 0.5, 1.1, 1.5]])
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0]])
    loss, ratio = per_token_loss(torch.log(ratios), torch.zeros(1, 4), adv, 0.2, 0.28)
    torch.testing.assert_close(loss, torch.tensor([[-1.28, 0.8, -2.2, 1.5]]))
    torch.testing.assert_close(ratio, ratios)


def test_dual_clip_caps_negative_advantage_loss():
    ratios = torch.tensor([[20.0, 20.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    loss, _ = per_token_loss(torch.log(ratios), torch.zeros(1, 2), adv, 0.2, 0.28, dual_clip_c=3.0)
    # A<0: min(max(20, 1.28), 3) = 3 ; A>0: -1.28 untouched
    torch.testing.assert_close(loss, torch.tensor([[3.0, -1.28]]))


def test_clip_higher_off_means_symmetric():
    assert effective_eps_high(DAPO) == 0.28
    assert effective_eps_high(GRPO) == 0.2
    # r = 1.25 with A > 0: inside [0.8, 1.28] for DAPO, clipped at 1.2 for GRPO
    logp = torch.full((1, 1), math.log(1.25))
    a = torch.ones(1)
    m = torch.ones(1, 1)
    dapo, dm = policy_loss(logp, torch.zeros(1, 1), a, m, DAPO)
    sym = LossConfig(0.2, 0.28, clip_higher=False, token_level_loss=True)
    grpo, gm = policy_loss(logp, torch.zeros(1, 1), a, m, sym)
    assert math.isclose(dapo.item(), -1.25, rel_tol=1e-6)
    assert math.isclose(grpo.item(), -1.2, rel_tol=1e-6)
    assert dm["clip_frac_high"].item() == 0.0 and gm["clip_frac_high"].item() == 1.0


def test_token_vs_sample_aggregation_hand_computed():
    # Sequence 1: 3 valid tokens with loss 1 each; sequence 2: 1 valid token with loss 5.
    loss = torch.tensor([[1.0, 1.0, 1.0, 9.0], [5.0, 9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # token-level: (1+1+1+5) / 4 = 2 ; sample-level: (1 + 5) / 2 = 3
    assert aggregate(loss, mask, token_level_loss=True).item() == 2.0
    assert aggregate(loss, mask, token_level_loss=False).item() == 3.0
    # with a global normalizer the sums are divided by it instead
    assert aggregate(loss, mask, True, normalizer=8).item() == 1.0
    assert aggregate(loss, mask, False, normalizer=4).item() == 1.5


def test_masked_tokens_change_nothing():
    torch.manual_seed(0)
    logp, old = torch.randn(3, 5), torch.randn(3, 5)
    adv = torch.randn(3)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [0, 0, 0, 0, 0]])
    loss, _ = policy_loss(logp, old, adv, mask, DAPO)
    logp2 = logp.clone()
    logp2[mask == 0] = 1e3  # garbage where masked (would be inf ratio) must not leak
    loss2, _ = policy_loss(logp2, old, adv, mask, DAPO)
    assert torch.isfinite(loss2)
    torch.testing.assert_close(loss, loss2)
    logp3 = logp2.clone().requires_grad_()
    loss3, _ = policy_loss(logp3, old, adv, mask, DAPO)
    loss3.backward()
    assert torch.isfinite(logp3.grad).all() and (logp3.grad[mask == 0] == 0).all()


def test_empty_mask_gives_zero_not_nan():
    loss, m = policy_loss(
        torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3), DAPO
    )
    assert loss.item() == 0.0 and m["clip_frac_low"].item() == 0.0


def test_clip_fractions_hand_computed():
    ratios = torch.tensor([[1.5, 0.5, 1.1, 0.5, 1.5, 0.7]])
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])  # last token (would be low-clipped) is padding
    _, m = policy_loss(torch.log(ratios), torch.zeros(1, 6), adv, mask, DAPO)
    assert math.isclose(m["clip_frac_high"].item(), 1 / 5, rel_tol=1e-6)  # token 0 only
    assert math.isclose(m["clip_frac_low"].item(), 1 / 5, rel_tol=1e-6)  # token 1 only
    assert m["num_tokens"].item() == 5


def test_gradient_is_zero_where_clipped():
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    loss, _ = policy_loss(logp, torch.zeros(1, 2), torch.ones(1), torch.ones(1, 2), DAPO)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0  # clipped: no gradient
    assert logp.grad[0, 1].item() < 0.0  # descending the loss raises logp of a positive-A token


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(2, 8),
    t=st.integers(1, 10),
    cut=st.integers(1, 7),
    token_level=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_chunking_invariance_with_global_normalizer(b, t, cut, token_level, seed):
    """Sum of micro-batch losses (global normalizer) == full-batch loss; gradients too."""
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    old = logp.detach() + torch.randn(b, t, generator=g, dtype=torch.float64) * 0.3
    adv = torch.randn(b, generator=g, dtype=torch.float64)
    mask = (torch.rand(b, t, generator=g) > 0.3).to(torch.float64)
    cfg = LossConfig(0.2, 0.28, True, token_level)
    cut = min(cut, b - 1)

    full_logp = logp.clone().requires_grad_()
    full, _ = policy_loss(full_logp, old, adv, mask, cfg)
    full.backward()

    normalizer = mask.sum() if token_level else (mask.sum(1) > 0).sum()
    chunk_logp = logp.clone().requires_grad_()
    total = 0.0
    for sl in (slice(0, cut), slice(cut, b)):
        part, _ = policy_loss(
            chunk_logp[sl], old[sl], adv[sl], mask[sl], cfg, normalizer=normalizer
        )
        part.backward()
        total = total + part.detach()
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(chunk_logp.grad, full_logp.grad)


def test_per_micro_batch_mean_differs_from_global():
    """The verl bug this design avoids: averaging per-micro-batch token means is not Eq. 12."""
    loss = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    eq12 = aggregate(loss, mask, True).item()  # (3 + 4) / 4
    per_micro = (aggregate(loss[:1], mask[:1], True) + aggregate(loss[1:], mask[1:], True)) / 2
    assert eq12 == 1.75 and per_micro.item() == 2.5


def test_old_probability_of_tokens_clipped_above_hand_computed():
    """pi_old summed over the tokens clipped above only: A > 0 and r > 1.28, unmasked."""
    old = torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]])
    ratios = torch.tensor([[1.5, 1.5, 1.1, 1.5, 1.5]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # token 4 would be clipped but is padding
    _, m = policy_loss(torch.log(old * ratios), torch.log(old), adv, mask, DAPO)
    assert math.isclose(m["clip_high_old_prob_sum"].item(), 0.1 + 0.2, rel_tol=1e-6)
    assert math.isclose(m["clip_frac_high"].item(), 2 / 4, rel_tol=1e-6)
