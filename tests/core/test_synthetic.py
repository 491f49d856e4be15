import numpy as np
import pytest

from dapo_core.config import ConfigError
from dapo_core.reward import score
from dapo_core.synthetic import arith_problems, solution


def test_deterministic_disjoint_and_correct():
    train, test = arith_problems(seed=3, num_train=300, num_test=50, max_operand=19, num_terms=2)
    again, _ = arith_problems(seed=3, num_train=300, num_test=50, max_operand=19, num_terms=2)
    assert train == again
    assert len(train) == 300 and len(test) == 50
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert len({p.id for p in train + test}) == 350
    for p in train[:20]:
        ops = [int(x) for x in p.problem.removeprefix("Compute ").rstrip(".").split(" + ")]
        assert int(p.answer) == sum(ops) and all(0 <= x <= 19 for x in ops)
        assert score(solution(p), p.answer).acc


def test_other_seed_differs_and_space_is_checked():
    a, _ = arith_problems(seed=1, num_train=50, num_test=0, max_operand=99, num_terms=2)
    b, _ = arith_problems(seed=2, num_train=50, num_test=0, max_operand=99, num_terms=2)
    assert a != b
    with pytest.raises(ConfigError, match="distinct problems.*lower synthetic.num_train"):
        arith_problems(seed=0, num_train=90, num_test=20, max_operand=9, num_terms=2)


def test_chain_problems_span_the_term_counts_and_their_solutions_add_up():
    from dapo_core.synthetic import chain_problems, chain_steps, operands

    train, test = chain_problems(seed=5, num_train=400, num_test=100, max_operand=9, max_terms=7)
    assert train == chain_problems(5, 400, 100, 9, 7)[0]
    assert not {p.problem for p in train} & {p.problem for p in test}
    assert {len(operands(p)) for p in train} == set(range(2, 8))  # every chain length occurs
    long_and_short = set()
    for p in train:
        ops = operands(p)
        steps = chain_steps(p)
        assert len(steps) == len(ops) - 1 and p.source == "synthetic:chain"
        total = 0
        for i, line in enumerate(steps):  # each line adds the next operand to the running sum
            lhs, rhs = line.split("=")
            terms = [int(x) for x in lhs.split("+") if x]
            total = sum(ops[: i + 2])
            assert int(rhs) == total and terms[-1] == ops[i + 1]
            if i:
                long_and_short.add(len(terms))
        assert total == int(p.answer) and score(solution(p), p.answer).acc
        assert solution(p).splitlines()[-1] == f"Answer: {p.answer}"
    assert long_and_short == {1, 2}  # both spellings of a step ("+5=15", "10+5=15") occur
    # the response grows with the chain: a 7-term solution is several times a 2-term one
    chars = {k: np.mean([len(solution(p)) for p in train if len(operands(p)) == k]) for k in (2, 7)}
    assert chars[7] > 2.5 * chars[2]


def test_chain_needs_two_terms_and_room():
    from dapo_core.synthetic import chain_problems, synthetic_task

    with pytest.raises(ValueError, match="num_terms >= 2"):
        chain_problems(0, 10, 0, 9, 1)
    with pytest.raises(ValueError, match="distinct problems"):
        chain_problems(0, 90, 20, 9, 2)  # only 100 two-term problems exist
    with pytest.raises(ValueError, match="unknown synthetic task"):
        synthetic_task("synthetic:calculus", 0, 1, 1, 9, 2)
