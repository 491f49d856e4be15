import pytest

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
    with pytest.raises(ValueError, match="distinct problems"):
        arith_problems(seed=0, num_train=90, num_test=20, max_operand=9, num_terms=2)
