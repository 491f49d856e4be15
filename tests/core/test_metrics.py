import math
from itertools import combinations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_core.metrics import (
    avg_at_k,
    bootstrap_ci,
    maj_at_k,
    majority_vote,
    masked_mean,
    mean_pass_at_k,
    pass_at_k,
    token_entropy,
)
from dapo_core.reward import answer_key


def test_avg_at_k():
    assert avg_at_k(np.array([[1, 0, 0, 0], [1, 1, 1, 1]])) == 5 / 8


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert math.isclose(pass_at_k(4, 1, 1), 0.25)
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert math.isclose(pass_at_k(4, 1, 2), 0.5)
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 8), data=st.data())
def test_pass_at_k_equals_enumeration(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    samples = [1] * c + [0] * (n - c)
    subsets = list(combinations(samples, k))
    exact = sum(any(s) for s in subsets) / len(subsets)
    assert math.isclose(pass_at_k(n, c, k), exact, abs_tol=1e-12)


def test_mean_pass_at_k():
    correct = np.array([[1, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
    assert math.isclose(mean_pass_at_k(correct, 2), 0.25)


def test_majority_vote_and_maj_at_k():
    assert majority_vote(["3", None, "4", "4", "3"]) == "3"  # tie -> first seen
    assert majority_vote([None, None]) is None
    preds = [["5", "5", "6", "6", "6"], ["1", None, None, "2", "2"]]
    assert maj_at_k(preds, ["5", "1"], k=3) == 1.0
    assert maj_at_k(preds, ["5", "1"], k=5) == 0.0


def test_majority_vote_by_key():
    # by text "0.25" wins (2 votes to 1 each); by value 1/2 has 3 votes and its first
    # answer, "0.5", is returned
    preds = ["0.25", "0.5", None, "1/2", "0.25", "\\frac{1}{2}"]
    assert majority_vote(preds) == "0.25"
    assert majority_vote(preds, answer_key) == "0.5"
    assert majority_vote(["3", "three"], lambda p: None if p == "3" else p) == "three"  # abstains
    assert maj_at_k([preds], ["\\dfrac12"], k=6, key=answer_key) == 1.0
    assert maj_at_k([preds], ["\\dfrac12"], k=6) == 0.0
    assert maj_at_k([preds], ["1/4"], k=2, key=answer_key) == 1.0  # tie 0.25 : 0.5, first seen
    assert maj_at_k([preds], ["1/2"], k=2, key=answer_key) == 0.0
    assert maj_at_k([preds], ["1/2"], k=4, key=answer_key) == 1.0  # 0.5, 1/2 against 0.25


def test_bootstrap_ci_brackets_mean_and_is_deterministic():
    x = np.array([0.0, 0.25, 0.5, 1.0, 0.75, 0.1])
    low, high = bootstrap_ci(x, n_boot=2000, seed=1)
    assert low <= x.mean() <= high and low >= 0 and high <= 1
    assert bootstrap_ci(x, n_boot=2000, seed=1) == (low, high)
    assert bootstrap_ci(np.ones(5)) == (1.0, 1.0)


def test_token_entropy_hand_computed():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]])
    h = token_entropy(logits)
    torch.testing.assert_close(h, torch.tensor([math.log(4), 0.0]), atol=1e-5, rtol=0)
    # temperature -> infinity flattens to uniform
    torch.testing.assert_close(
        token_entropy(logits[1:], temperature=1e6), torch.tensor([math.log(4)])
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-20, 20), min_size=2, max_size=16))
def test_entropy_matches_definition(z):
    logits = torch.tensor(z, dtype=torch.float64)
    p = torch.softmax(logits, -1)
    ref = -(p * torch.log_softmax(logits, -1)).sum()
    assert math.isclose(token_entropy(logits).item(), ref.item(), abs_tol=1e-5)


def test_masked_mean():
    assert masked_mean(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1, 1, 0])).item() == 2.0
    assert masked_mean(torch.tensor([5.0]), torch.tensor([0])).item() == 0.0
