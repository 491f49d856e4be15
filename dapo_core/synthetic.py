"""The embedded synthetic tasks: integer arithmetic in the DAPO answer format.

They let the whole pipeline run with no download: problems such as "Compute 12 + 7." with integer
answers, train and test disjoint, reproducible from a seed. The response format is DAPO's (a last
line ``Answer: N``, scored by the same reward as real data), but the prompt is the bare problem
rather than the 60-token DAPO template: on a 2-core CPU the template would cost most of the compute
of every step.

- ``synthetic:arith``: ``num_terms`` operands from 0..``max_operand``; the reference response is
  the bare answer line (a few tokens). Every response has about the same length, so the length
  mechanisms of DAPO (overlong filtering and shaping, token-level loss) have nothing to act on.
- ``synthetic:chain``: 2..``num_terms`` operands; the reference response writes the running sum one
  line per term ("3+7=10", then "10+5=15" or the shorter "+5=15", ...) before the answer line. The
  response length grows with the number of terms (several-fold), long chains approach or pass
  ``rollout.max_response_len`` and err more often, and each step line has a long and a short
  spelling, so a policy can shorten its responses when the length is punished. This is the task on
  which each rung of the Table 1 ladder has something to act on (``configs/chain.yaml``).
"""

from __future__ import annotations

import random
import re

from dapo_core.config import ConfigError
from dapo_core.problem import Problem

ARITH = "synthetic:arith"
CHAIN = "synthetic:chain"
TASKS = (ARITH, CHAIN)
MIN_CHAIN_TERMS = 2


def synthetic_task(
    task: str, seed: int, num_train: int, num_test: int, max_operand: int, num_terms: int
) -> tuple[list[Problem], list[Problem]]:
    """(train, test) of the embedded ``task`` (one of ``TASKS``)."""
    if task == ARITH:
        return arith_problems(seed, num_train, num_test, max_operand, num_terms)
    if task == CHAIN:
        return chain_problems(seed, num_train, num_test, max_operand, num_terms)
    raise ValueError(f"unknown synthetic task {task!r}; the embedded ones are {list(TASKS)}")


def arith_problems(
    seed: int, num_train: int, num_test: int, max_operand: int, num_terms: int
) -> tuple[list[Problem], list[Problem]]:
    """Distinct problems, test disjoint from train (as operand tuples), shuffled by ``seed``."""
    space = (max_operand + 1) ** num_terms
    _check_space(space, num_train + num_test, f"max_operand={max_operand}, num_terms={num_terms}")
    rng = random.Random(seed)
    operands = _distinct(num_train + num_test, lambda: _draw(rng, num_terms, max_operand))
    problems = [_problem(f"arith-{i:06d}", ops, ARITH) for i, ops in enumerate(operands)]
    return problems[:num_train], problems[num_train:]


def chain_problems(
    seed: int, num_train: int, num_test: int, max_operand: int, max_terms: int
) -> tuple[list[Problem], list[Problem]]:
    """Distinct running-sum problems of 2..``max_terms`` operands (the count uniform, so every
    chain length is equally common), test disjoint from train, shuffled by ``seed``."""
    if max_terms < MIN_CHAIN_TERMS:
        raise ValueError(f"synthetic:chain needs num_terms >= {MIN_CHAIN_TERMS}, got {max_terms}")
    space = sum((max_operand + 1) ** k for k in range(MIN_CHAIN_TERMS, max_terms + 1))
    _check_space(space, num_train + num_test, f"max_operand={max_operand}, num_terms={max_terms}")
    rng = random.Random(seed)

    def draw() -> tuple[int, ...]:
        return _draw(rng, rng.randint(MIN_CHAIN_TERMS, max_terms), max_operand)

    operands = _distinct(num_train + num_test, draw)
    problems = [_problem(f"chain-{i:06d}", ops, CHAIN) for i, ops in enumerate(operands)]
    return problems[:num_train], problems[num_train:]


def _check_space(space: int, wanted: int, knobs: str) -> None:
    if wanted > space:
        raise ConfigError(
            f"only {space} distinct problems exist with {knobs}; asked for {wanted}: lower "
            "synthetic.num_train or synthetic.num_test, or raise synthetic.max_operand"
        )


def _draw(rng: random.Random, terms: int, max_operand: int) -> tuple[int, ...]:
    return tuple(rng.randint(0, max_operand) for _ in range(terms))


def _distinct(count: int, draw) -> list[tuple[int, ...]]:
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, ...]] = []
    while len(out) < count:
        ops = draw()
        if ops not in seen:
            seen.add(ops)
            out.append(ops)
    return out


def _problem(pid: str, ops: tuple[int, ...], source: str) -> Problem:
    text = f"Compute {' + '.join(str(x) for x in ops)}."
    return Problem(pid, text, str(sum(ops)), prompt=text, source=source)


def operands(problem: Problem) -> tuple[int, ...]:
    """The operands of a synthetic problem ("Compute 3 + 7 + 5." -> (3, 7, 5))."""
    return tuple(int(x) for x in re.findall(r"\d+", problem.problem))


def solution(problem: Problem) -> str:
    """The reference response used for the supervised warm start (the DAPO answer format): the
    answer line, after the running-sum steps for ``synthetic:chain``."""
    if problem.source != CHAIN:
        return f"Answer: {problem.answer}"
    return "\n".join([*chain_steps(problem), f"Answer: {problem.answer}"])


def chain_steps(problem: Problem) -> list[str]:
    """The running-sum lines of a chain problem. After the first, each line is spelled long
    ("10+5=15") or short ("+5=15") at random, seeded by the problem id: the warm start then
    teaches both spellings, and a sampled response's length varies within its group."""
    ops = operands(problem)
    rng = random.Random(problem.id)
    total = ops[0] + ops[1]
    lines = [f"{ops[0]}+{ops[1]}={total}"]
    for x in ops[2:]:
        head = f"{total}+" if rng.random() < 0.5 else "+"
        total += x
        lines.append(f"{head}{x}={total}")
    return lines
