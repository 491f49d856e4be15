"""The embedded synthetic task: integer arithmetic in the DAPO prompt format.

It lets the whole pipeline run with no download: problems such as "Compute 12 + 7." with integer
answers, train and test disjoint, reproducible from a seed. ``max_operand`` and ``num_terms`` are
the difficulty knobs. The response format is DAPO's (a last line ``Answer: N``, scored by the same
reward as real data), but the prompt is the bare problem rather than the 60-token DAPO template:
on a 2-core CPU the template would cost most of the compute of every step.
"""

from __future__ import annotations

import random

from dapo_core.problem import Problem

SOURCE_NAME = "synthetic:arith"


def arith_problems(
    seed: int, num_train: int, num_test: int, max_operand: int, num_terms: int
) -> tuple[list[Problem], list[Problem]]:
    """Distinct problems, test disjoint from train (as operand tuples), shuffled by ``seed``."""
    space = (max_operand + 1) ** num_terms
    if num_train + num_test > space:
        raise ValueError(
            f"only {space} distinct problems exist with max_operand={max_operand}, "
            f"num_terms={num_terms}; asked for {num_train} + {num_test}"
        )
    rng = random.Random(seed)
    seen: set[tuple[int, ...]] = set()
    operands: list[tuple[int, ...]] = []
    while len(operands) < num_train + num_test:
        ops = tuple(rng.randint(0, max_operand) for _ in range(num_terms))
        if ops not in seen:
            seen.add(ops)
            operands.append(ops)
    problems = [_problem(i, ops) for i, ops in enumerate(operands)]
    return problems[:num_train], problems[num_train:]


def _problem(index: int, ops: tuple[int, ...]) -> Problem:
    expr = " + ".join(str(x) for x in ops)
    text = f"Compute {expr}."
    return Problem(f"arith-{index:06d}", text, str(sum(ops)), prompt=text, source=SOURCE_NAME)


def solution(problem: Problem) -> str:
    """The reference response used for the supervised warm start (the DAPO answer format)."""
    return f"Answer: {problem.answer}"
