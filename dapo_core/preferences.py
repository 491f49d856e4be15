"""Learning from preferences (issue 27): pairs mined from the policy's own groups, the
Bradley-Terry loss of a reward model and the DPO loss.

- **Pair mining.** A group is the G responses to one prompt, each with its rule-based reward. In a
  group whose rewards differ, a response of the group's highest reward is *chosen* and one of its
  lowest reward is *rejected*; two responses of equal reward are never paired (the pair would
  teach nothing, and a reward model would be asked to separate what the rule calls equal). A
  group of equal rewards gives no pair, as dynamic sampling keeps no such group (DAPO Eq. 11).
- **Bradley-Terry** (Bradley & Terry 1952; the reward-model loss of Ouyang et al. 2022, Eq. 1):
  P(y+ > y-) = sigmoid(r(x, y+) - r(x, y-)), trained by L = -log sigmoid(r+ - r-), the mean over
  pairs. Its gradient with respect to the margin m = r+ - r- is -sigmoid(-m).
- **DPO** (Rafailov et al. 2023, Eq. 7): with the policy's and the frozen reference's sequence
  log-probs (sums over the response's tokens),
  h = beta * [(log pi(y+) - log pi_ref(y+)) - (log pi(y-) - log pi_ref(y-))] and
  L = -log sigmoid(h). At pi = pi_ref, h = 0 and L = log 2; dL/d log pi(y+) = -beta * sigmoid(-h).
  beta * (log pi(y) - log pi_ref(y)) is the implicit reward of a response (section 5).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dapo_core.algos import Metrics


@dataclass(frozen=True)
class Pair:
    """Response ``chosen`` over response ``rejected`` of group ``group`` (indices into it)."""

    group: int
    chosen: int
    rejected: int


def mine_pairs(rewards: Tensor, per_group: int = 1, seed: int = 0) -> list[Pair]:
    """Preference pairs from (P, G) rewards: in each group whose rewards differ, up to
    ``per_group`` distinct (highest-reward, lowest-reward) pairs, drawn with ``seed``."""
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (groups, group_size), got shape {tuple(rewards.shape)}")
    if per_group < 1:
        raise ValueError(f"per_group must be >= 1, got {per_group}")
    rng = random.Random(seed)
    pairs = []
    for p, row in enumerate(rewards.tolist()):
        best, worst = max(row), min(row)
        if best == worst:
            continue
        candidates = [
            (c, r)
            for c, rc in enumerate(row)
            if rc == best
            for r, rr in enumerate(row)
            if rr == worst
        ]
        rng.shuffle(candidates)
        pairs += [Pair(p, c, r) for c, r in candidates[:per_group]]
    return pairs


def sequence_logp(token_logp: Tensor, mask: Tensor) -> Tensor:
    """(B,) a response's log-probability: the sum of its (B, T) token log-probs under ``mask``."""
    return (token_logp * mask.to(token_logp.dtype)).sum(dim=-1)


def bradley_terry_loss(r_chosen: Tensor, r_rejected: Tensor) -> tuple[Tensor, Metrics]:
    """The mean Bradley-Terry loss over pairs of scalar rewards, and its metrics as (numerator,
    denominator): ``pair_accuracy`` (r+ > r-, ties count as wrong) and ``reward_margin``."""
    margin = r_chosen - r_rejected
    n = torch.tensor(float(margin.numel()))
    loss = -F.logsigmoid(margin).mean()
    metrics = {
        "pair_accuracy": ((margin > 0).float().sum().detach(), n),
        "reward_margin": (margin.sum().detach(), n),
    }
    return loss, metrics


def dpo_loss(
    logp_chosen: Tensor,
    logp_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    beta: float,
) -> tuple[Tensor, Metrics]:
    """The mean DPO loss over pairs from (B,) sequence log-probs under the policy and the frozen
    reference, and its metrics as (numerator, denominator): ``pair_accuracy`` (the implicit
    reward of y+ above that of y-), ``reward_margin`` and the implicit rewards themselves."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen = beta * (logp_chosen - ref_chosen)  # implicit rewards
    rejected = beta * (logp_rejected - ref_rejected)
    h = chosen - rejected
    n = torch.tensor(float(h.numel()))
    loss = -F.logsigmoid(h).mean()
    metrics = {
        "pair_accuracy": ((h > 0).float().sum().detach(), n),
        "reward_margin": (h.sum().detach(), n),
        "reward_chosen": (chosen.sum().detach(), n),
        "reward_rejected": (rejected.sum().detach(), n),
    }
    return loss, metrics


@dataclass(frozen=True)
class CalibrationBin:
    """Predictions with P(first preferred) in [lo, hi): their mean prediction, the share in
    which the first response was the chosen one, and their count."""

    lo: float
    hi: float
    predicted: float
    observed: float
    count: int


def calibration_curve(margins: Tensor, bins: int = 10) -> tuple[list[CalibrationBin], float]:
    """The reward model's calibration on held-out pairs, and its expected calibration error.

    A pair (y+, y-) with margin m = r(y+) - r(y-) is read in both orders, as an unordered pair
    would be shown: P(first preferred) = sigmoid(m) with outcome 1, and sigmoid(-m) with outcome
    0 (otherwise every outcome is 1 and any model that ranks well looks "under-confident").
    Predictions are binned on [0, 1] in ``bins`` equal bins; the error is the count-weighted mean
    |predicted - observed| (Guo et al. 2017, ECE). Empty bins are left out."""
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    m = margins.detach().double().flatten()
    p = torch.cat([torch.sigmoid(m), torch.sigmoid(-m)])
    y = torch.cat([torch.ones_like(m), torch.zeros_like(m)])
    which = (p * bins).long().clamp(max=bins - 1)  # p == 1 goes into the last bin
    out, ece = [], 0.0
    for b in range(bins):
        sel = which == b
        n = int(sel.sum())
        if n == 0:
            continue
        pred, obs = float(p[sel].mean()), float(y[sel].mean())
        out.append(CalibrationBin(b / bins, (b + 1) / bins, pred, obs, n))
        ece += n * abs(pred - obs)
    return out, ece / max(int(p.numel()), 1)
