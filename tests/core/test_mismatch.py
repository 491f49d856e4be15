"""Train/rollout mismatch and truncated importance sampling (dapo_core.mismatch), by hand."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from dapo_core.algos import TokenBatch, aggregate, reduce_metrics
from dapo_core.config import ConfigError
from dapo_core.mismatch import log_ratio, mismatch_sums, tis_weights

# Two valid tokens with pi_old / pi_rollout = 0.5 / 0.4 = 1.25 and 0.2 / 0.25 = 0.8, then padding.
OLD = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
ROLLOUT = torch.log(torch.tensor([[0.4, 0.25, 1e-30]]))
MASK = torch.tensor([[1.0, 1.0, 0.0]])


def test_log_ratio_is_zero_on_padding():
    lr = log_ratio(OLD, ROLLOUT, MASK)
    torch.testing.assert_close(lr, torch.tensor([[math.log(1.25), math.log(0.8), 0.0]]))


def test_tis_weights_truncate_at_the_cap_and_leave_padding_at_one():
    w = tis_weights(OLD, ROLLOUT, MASK, cap=1.1)
    torch.testing.assert_close(w, torch.tensor([[1.1, 0.8, 1.0]]))
    w = tis_weights(OLD, ROLLOUT, MASK, cap=2.0)  # under the cap: the plain ratio
    torch.testing.assert_close(w, torch.tensor([[1.25, 0.8, 1.0]]))


def test_mismatch_sums_by_hand():
    s = mismatch_sums(OLD, ROLLOUT, MASK)
    assert s["tokens"].item() == 2
    # |ln 1.25| + |ln 0.8| = 2 ln 1.25 (0.8 = 1 / 1.25)
    assert s["abs_diff"].item() == pytest.approx(2 * math.log(1.25), rel=1e-6)
    # k3: (1.25 - 1 - ln 1.25) + (0.8 - 1 - ln 0.8) = 0.05 exactly (the logs cancel)
    assert s["kl"].item() == pytest.approx(0.05, abs=1e-6)
    assert s["max_ratio"].item() == pytest.approx(1.25, rel=1e-6)


def test_mismatch_of_an_empty_batch_is_zero():
    s = mismatch_sums(OLD, ROLLOUT, torch.zeros_like(MASK))
    assert s["tokens"].item() == 0 and s["kl"].item() == 0 and s["max_ratio"].item() == 0


@given(st.lists(st.floats(-8, 0), min_size=1, max_size=12), st.floats(-1, 1))
def test_k3_is_never_negative_and_zero_only_when_they_agree(logps, shift):
    old = torch.tensor([logps], dtype=torch.float64)
    mask = torch.ones_like(old)
    assert mismatch_sums(old, old - shift, mask)["kl"].item() >= 0
    assert mismatch_sums(old, old.clone(), mask)["kl"].item() == 0


def _loss(tis_cap, rollout):
    """DAPO's clip loss, token mean, through the trainer's path (``token_losses``), with the
    ``token_tis`` correction at ``tis_cap`` (None: no correction)."""
    from dapo_core.algorithm import Algorithm, choose, token_losses

    correction = ("token_tis", {"cap": tis_cap}) if tis_cap else ("none", {})
    alg = Algorithm(
        advantage=choose("advantage", "grpo", {}),
        correction=choose("correction", *correction),
        loss=choose("loss", "clip", {"eps_low": 0.2, "eps_high": 0.28}),
        aggregation=choose("aggregation", "token_mean", {}),
        kl=None,
    )
    logp = torch.log(torch.tensor([[0.5, 0.2]])).requires_grad_()
    batch = TokenBatch(logp, logp.detach(), torch.ones(1, 2), torch.ones(1, 2), rollout)
    loss_t, keep, metrics = token_losses(alg, batch)
    loss = aggregate(alg.aggregation.entry, alg.aggregation.params, loss_t, keep)
    loss.backward()
    return loss.item(), logp.grad, reduce_metrics([metrics])


def test_tis_weights_each_tokens_loss_and_gradient():
    # Ratio r = 1 (one update: old = logp), A = 1: each token's loss is -1, its gradient -1/2.
    rollout = torch.log(torch.tensor([[0.25, 0.4]]))  # pi_old / pi_rollout = 2 and 0.5
    plain, g_plain, _ = _loss(None, rollout)
    assert plain == pytest.approx(-1.0) and torch.allclose(g_plain, torch.tensor([[-0.5, -0.5]]))
    capped, g_capped, m = _loss(1.5, rollout)  # weights min(2, 1.5) = 1.5 and 0.5
    assert capped == pytest.approx(-(1.5 + 0.5) / 2)
    torch.testing.assert_close(g_capped, torch.tensor([[-0.75, -0.25]]))
    assert m["is_capped_frac"].item() == pytest.approx(0.5)  # the first token's weight


def test_tis_without_rollout_log_probs_is_refused():
    with pytest.raises(ConfigError, match="needs the sampler's log-probs"):
        _loss(2.0, None)
