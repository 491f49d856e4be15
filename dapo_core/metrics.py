"""Evaluation and training metrics: avg@k, unbiased pass@k, maj@k, bootstrap CI, token entropy.

- avg@k (the DAPO paper's AIME number): mean accuracy over all k samples of all problems.
- pass@k: the unbiased estimator of Chen et al. 2021 (Codex, Eq. 1) from n samples with c correct,
  1 - C(n-c, k) / C(n, k), computed as a stable product.
- maj@k: accuracy of the majority-voted answer among the first k samples (unparseable ones abstain;
  answers vote by a key when given, e.g. their value, not their text).
- A percentile bootstrap 95% CI over problems (problems, not samples, are the unit of variance).
- Token entropy H = logsumexp(z) - sum softmax(z) z of temperature-scaled logits z.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np
import torch


def avg_at_k(correct: np.ndarray) -> float:
    """(N, k) booleans -> mean accuracy over all N * k samples."""
    correct = np.asarray(correct, dtype=np.float64)
    return float(correct.mean()) if correct.size else 0.0


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # 1 - prod_{i=n-c+1}^{n} (1 - k / i): no huge binomials, no cancellation.
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct: np.ndarray, k: int) -> float:
    """(N, n) booleans -> pass@k averaged over the N problems."""
    correct = np.asarray(correct, dtype=bool)
    n = correct.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)]))


def majority_vote(
    preds: Sequence[Hashable | None], key: Callable[[Any], Hashable | None] | None = None
) -> Hashable | None:
    """The most frequent non-None answer; ties go to the answer seen first; None if none parsed.

    With ``key``, answers vote by ``key(answer)`` (e.g. ``dapo_core.reward.answer_key``, so that
    ``0.5`` and ``1/2`` are one answer) and the winner is the first answer of the winning group;
    an answer whose key is None abstains."""
    keys = [None if p is None else (p if key is None else key(p)) for p in preds]
    counts = Counter(k for k in keys if k is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(p for p, k in zip(preds, keys, strict=True) if k is not None and counts[k] == best)


def maj_at_k(
    preds: Sequence[Sequence[Hashable | None]],
    answers: Sequence[Hashable],
    k: int,
    key: Callable[[Any], Hashable | None] | None = None,
) -> float:
    """Share of problems whose majority answer among the first k samples equals the answer (by
    ``key`` when given, for the vote and the comparison alike)."""
    if not preds:
        return 0.0
    same = (
        (lambda a, b: a == b) if key is None else (lambda a, b: a is not None and key(a) == key(b))
    )
    hits = [same(majority_vote(p[:k], key), a) for p, a in zip(preds, answers, strict=True)]
    return float(np.mean(hits))


def bootstrap_ci(
    per_problem: np.ndarray, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap (1 - alpha) CI of the mean of per-problem scores."""
    x = np.asarray(per_problem, dtype=np.float64)
    if x.size == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)  # (n_boot,)
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def token_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """(..., V) logits -> (...) entropy of softmax(logits / temperature), in nats."""
    z = logits.float() / temperature
    logz = torch.logsumexp(z, dim=-1)  # (...)
    return logz - (torch.softmax(z, dim=-1) * z).sum(dim=-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 when the mask is empty)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)
