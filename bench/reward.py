"""Throughput of ``dapo_core.reward.score`` against a bare regex, and its agreement with labels.

Run with ``python -m bench.reward [--n 4000] [--repeats 5] [--strict]``.

Both scorers run over the same deterministic list of synthetic ~2 KB responses, in the same
process, interleaved in small chunks (alternating which goes first) so that CPU frequency and
cache effects hit both alike, and are timed by the thread's CPU time, which the load of other
processes does not inflate; each repeat is one full pass.
The target is that ``score`` keeps at least half the bare regex's throughput, i.e. costs at most
2x ``re.findall(r"Answer:\\s*(-?\\d+)", text)[-1]`` plus an int comparison, judged on the
medians over repeats. On a shared machine the median is noisy (an interpreter loop suffers more
from a busy sibling core than a C regex scan), so the best-of-repeats ratio is printed as well.
The exit code is 0 even on FAIL unless ``--strict`` is given.

``--agreement`` instead measures how often ``score`` and Math-Verify (``parse`` of the whole
response, ``verify``: how TRL, open-r1 and lighteval use it) agree with hand-written equivalence
labels: ``tests/fixtures/equivalence.jsonl`` (each case: a response, its answer format, a gold,
the label), and with ``--math-verify-tests DIR`` also the (gold, pred, expected) cases of
Math-Verify's own test files whose gold is a number (read from the files' literal
``pytest.mark.parametrize`` lists; the pred is the response, read in the ``auto`` format).
``--dapo-core DIR`` scores with the ``dapo_core`` found in DIR, e.g. an older revision exported
with ``git archive REV dapo_core | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import json
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import bench
from bench.common import positive_int

TARGET_RATIO = 2.0  # score's time over the bare regex's: throughput at least 0.5x
RESPONSE_CHARS = 2_000

_BARE_RE = re.compile(r"Answer:\s*(-?\d+)")

_STEP_TEMPLATES = (
    "Step {k}: We know that ${a} + {b} = {s}$, so the partial sum is {s}.",
    "Next, consider $x_{{{k}}} = \\frac{{{a}}}{{{b}}}$ and simplify the ratio carefully.",
    "Since {a} is divisible by {d}, we may write ${a} = {d} \\cdot {q}$ and continue.",
    "Let me double-check: {a} times {b} equals {p}, which matches the previous line.",
    "By the triangle inequality, the answer must be less than {s}, so we refine the bound.",
    "We substitute $n = {k}$ into $f(n) = n^2 + {a}n + {b}$ to get $f({k}) = {f}$.",
    "Hmm, wait. Let me reconsider the case where the remainder is {r} modulo {d}.",
    "Counting the arrangements gives $\\binom{{{k}}}{{2}} = {c}$ ways for this block.",
)


def _step(rng: random.Random, k: int) -> str:
    a, b, d = rng.randint(2, 999), rng.randint(2, 999), rng.randint(2, 9)
    values = {"k": k, "a": a, "b": b, "d": d, "s": a + b, "p": a * b, "q": a // d, "r": a % d}
    values.update(f=k * k + a * k + b, c=k * (k - 1) // 2)
    return rng.choice(_STEP_TEMPLATES).format(**values)


def _ending(rng: random.Random, n: int) -> tuple[str, bool]:
    """A final line for ground truth ``n`` and whether it should score as correct."""
    roll = rng.random()
    if roll < 0.70:
        return f"Answer: {n}", True
    if roll < 0.78:
        return rng.choice([f"**Answer:** ${n}$", f"Answer: $\\boxed{{{n}}}$"]), True
    if roll < 0.88:
        return f"Therefore, the final answer is $\\boxed{{{n}}}$.", True
    if roll < 0.93:
        return rng.choice([f"Answer: \\frac{{{2 * n}}}{{2}}", f"Answer: ${n}^\\circ$"]), True
    return rng.choice([f"Answer: {n + 1}", f"Answer: {n} or {n + 1}", "Answer: "]), False


def make_responses(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` deterministic (response, ground_truth) pairs of about RESPONSE_CHARS each."""
    rng = random.Random(seed)
    data = []
    for _ in range(n):
        truth = rng.randint(0, 999)
        lines, size, k = [], 0, 1
        while size < RESPONSE_CHARS:
            line = _step(rng, k)
            lines.append(line)
            size += len(line) + 1
            k += 1
        lines.append(_ending(rng, truth)[0])
        data.append(("\n".join(lines), str(truth)))
    return data


def bare_regex(response: str, ground_truth: str) -> bool:
    """The reference extractor the target is measured against."""
    found = _BARE_RE.findall(response)
    return bool(found) and int(found[-1]) == int(ground_truth)


CHUNK = 50  # responses per interleaved timing slice
# This thread's CPU time: what a scorer costs, without the time other processes hold the core
# (on 2 shared cores wall-clock medians of back-to-back runs were 1.3x and 3.2x).
_clock = time.thread_time


def _time_score(part: list[tuple[str, str]]) -> float:
    score = _scorer()
    start = _clock()
    for response, truth in part:
        score(response, truth)
    return _clock() - start


def _time_bare(part: list[tuple[str, str]]) -> float:
    start = _clock()
    for response, truth in part:
        bare_regex(response, truth)
    return _clock() - start


def timed_pass(data: list[tuple[str, str]], flip: bool) -> tuple[float, float]:
    """Seconds for (score, bare regex) over ``data``, interleaved chunk by chunk."""
    t_score = t_bare = 0.0
    for k, i in enumerate(range(0, len(data), CHUNK)):
        part = data[i : i + CHUNK]
        if (k % 2 == 0) != flip:
            t_score += _time_score(part)
            t_bare += _time_bare(part)
        else:
            t_bare += _time_bare(part)
            t_score += _time_score(part)
    return t_score, t_bare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--n", type=positive_int, default=4_000, help="number of synthetic responses"
    )
    parser.add_argument(
        "--repeats", type=positive_int, default=5, help="interleaved timing repeats"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--strict", action="store_true", help="exit 1 when the target is missed")
    parser.add_argument(
        "--agreement", action="store_true", help="measure agreement with labels instead"
    )
    parser.add_argument("--labels", type=Path, default=LABELS, help="hand-labelled cases (jsonl)")
    parser.add_argument("--math-verify-tests", type=Path, help="Math-Verify's tests/ directory")
    parser.add_argument("--dapo-core", type=Path, help="import dapo_core from this directory")
    args = parser.parse_args(argv)
    if args.dapo_core:
        sys.path.insert(0, str(args.dapo_core.resolve()))
        for name in [m for m in sys.modules if m == "dapo_core" or m.startswith("dapo_core.")]:
            del sys.modules[name]  # imported already (by bench.common): import it from there
    if args.agreement:
        return agreement(args.labels, args.math_verify_tests)
    return throughput(args.n, args.repeats, args.seed, args.strict)


def throughput(n: int, repeats: int, seed: int, strict: bool) -> int:
    """Time ``score`` against the bare regex; print rates and the verdict."""
    score = _scorer()
    data = make_responses(n, seed)
    mean_chars = statistics.fmean(len(r) for r, _ in data)
    timed_pass(data[: 4 * CHUNK], flip=False)  # warm-up: regex compilation, caches

    score_times, bare_times = [], []
    for i in range(repeats):
        t_score, t_bare = timed_pass(data, flip=i % 2 == 1)
        score_times.append(t_score)
        bare_times.append(t_bare)

    t_score, t_bare = statistics.median(score_times), statistics.median(bare_times)
    ratio = t_score / t_bare
    best_ratio = min(score_times) / min(bare_times)
    accuracy = statistics.fmean(score(r, t).acc for r, t in data)
    bare_accuracy = statistics.fmean(bare_regex(r, t) for r, t in data)
    verdict = "PASS" if ratio <= TARGET_RATIO else "FAIL"

    print(f"responses: {n} (mean {mean_chars:.0f} chars), repeats: {repeats}")
    for name, seconds in (("score():", t_score), ("bare regex:", t_bare)):
        rate, each_us = n / seconds, seconds / n * 1e6
        print(f"{name:<12} {rate:>12,.0f} responses/s  ({each_us:.2f} us each)")
    print(f"accuracy:    score {accuracy:.3f}, bare regex {bare_accuracy:.3f}")
    print(f"best-of-{repeats}:   ratio {best_ratio:.2f}x (for reference)")
    print(
        f"ratio:       {ratio:.2f}x of medians, throughput {1 / ratio:.2f}x the bare regex's "
        f"(target >= {1 / TARGET_RATIO:.1f}x)  {verdict}"
    )
    return 1 if strict and verdict == "FAIL" else 0


# --- agreement with equivalence labels --------------------------------------------------------

LABELS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "equivalence.jsonl"


def _scorer() -> Callable[..., Any]:
    """``dapo_core.reward.score`` (from ``--dapo-core`` when given), imported at first use."""
    return importlib.import_module("dapo_core.reward").score


def agreement(labels: Path, math_verify_tests: Path | None) -> int:
    """Print, per kind of case, how often ``score`` and Math-Verify agree with the labels."""
    cases = [json.loads(line) for line in labels.read_text(encoding="utf-8").splitlines()]
    _report(f"{labels.name}", cases)
    if math_verify_tests is not None:
        found = list(math_verify_cases(math_verify_tests))
        _report(f"Math-Verify's tests, numeric golds ({math_verify_tests})", found)
    return 0


def _report(title: str, cases: list[dict[str, Any]]) -> None:
    ours, theirs = _judge_ours(), _judge_math_verify()
    by_kind: dict[str, list[tuple[bool, bool]]] = {}
    for case in cases:
        label = case["equivalent"]
        hits = (ours(case) is label, theirs(case) is label)
        by_kind.setdefault(case["kind"], []).append(hits)
    width = max(len(kind) for kind in [*by_kind, "kind"])
    print(f"{title}: {len(cases)} cases, how many of them each judges as labelled")
    print(f"  {'kind':<{width}} {'cases':>5} {'score()':>8} {'math-verify':>12}")
    everything = [h for v in by_kind.values() for h in v]
    for kind, hits in [*sorted(by_kind.items()), ("all", everything)]:
        ours_right, theirs_right = sum(h[0] for h in hits), sum(h[1] for h in hits)
        print(f"  {kind:<{width}} {len(hits):>5} {ours_right:>8} {theirs_right:>12}")


def _judge_ours() -> Callable[[dict[str, Any]], bool]:
    score = _scorer()
    takes_format = "answer_format" in inspect.signature(score).parameters

    def judge(case: dict[str, Any]) -> bool:
        if takes_format:
            return score(case["response"], case["gold"], case["format"]).acc
        return score(case["response"], case["gold"]).acc  # a scorer from before the formats

    return judge


def _judge_math_verify() -> Callable[[dict[str, Any]], bool]:
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its timeout notices

    def judge(case: dict[str, Any]) -> bool:
        gold = case["gold"]
        if "\\" in gold and not any(d in gold for d in ("$", "\\(", "\\[", "\\boxed")):
            gold = f"${gold}$"  # LaTeX that Math-Verify reads only inside delimiters
        found = parse(case["response"], parsing_timeout=None)
        return bool(verify(parse(gold, parsing_timeout=None), found, timeout_seconds=None))

    return judge


def math_verify_cases(tests_dir: Path) -> Iterable[dict[str, Any]]:
    """(gold, pred, expected) rows of Math-Verify's test files whose gold is a number, as cases
    (kind: the test function; format ``auto``; the pred is the response)."""
    for path in sorted(tests_dir.glob("test_*.py")):
        for function, rows in _parametrized_rows(path):
            for row in rows:
                if _is_number(row["gold"]):
                    label = bool(row.get("expected", row.get("result")))
                    yield {
                        "kind": function,
                        "format": "auto",
                        "gold": row["gold"],
                        "response": row["pred"],
                        "equivalent": label,
                    }


def _parametrized_rows(path: Path) -> Iterable[tuple[str, list[dict[str, Any]]]]:
    """(test name, rows) of each literal ``@pytest.mark.parametrize("gold, pred, ...", [...])``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and len(decorator.args) == 2):
                continue
            if getattr(decorator.func, "attr", "") != "parametrize":
                continue
            try:
                names = [n.strip() for n in ast.literal_eval(decorator.args[0]).split(",")]
                rows = ast.literal_eval(decorator.args[1])
            except (ValueError, AttributeError):
                continue  # not literal
            if names[:2] == ["gold", "pred"]:
                yield node.name, [dict(zip(names, row, strict=True)) for row in rows]


def _is_number(gold: str) -> bool:
    """Whether Math-Verify reads ``gold`` as one real number (no symbols, sets or relations)."""
    import sympy
    from math_verify import parse

    found = parse(gold, parsing_timeout=None)
    value = found[0] if found else None
    if not isinstance(value, sympy.Expr) or isinstance(value, sympy.Tuple) or value.free_symbols:
        return False
    return bool(value.is_real)


if __name__ == "__main__":
    bench.run(main)
