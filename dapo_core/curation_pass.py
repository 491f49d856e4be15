"""The curation pass: input records in, integer-answer problems and rejected rows out (DAPO 3.5).

DAPO (arXiv 2503.14476, section 3.5 "Dataset Transformation") trains only on problems whose answer
is an integer, so that a rule-based verifier grades every response exactly. This module composes
the helpers of ``dapo_core.curation`` into one pass with no file I/O; the readers and writers are
in ``tasks/data``. Every input row ends in exactly one place:

1. parse (``dapo_core.records``): the problem, template stripped, and its raw answer; else a
   malformed-row reason;
2. answer: canonical integer (``"023"`` -> ``"23"``), else its integer form (``integerize``: the
   problem gets the form's instruction appended and the answer becomes the reported integer),
   else dropped (``no_integer_form``);
3. dedupe: copies of a problem (whitespace-insensitive ``dedupe_key``) collapse into the first
   (``duplicate``); a problem whose copies disagree on the normalised answer is dropped, every
   copy of it (``conflicting_answers``);
4. decontaminate against the eval sets, when given (``contaminated``);
5. :func:`split_validation`: the problems with the smallest hash of their id form the validation
   set, deterministically and independently of row order.

Ids are stable across runs: the first 16 hex digits of the sha1 of the problem's dedupe key (the
synthetic task keeps its own ``arith-NNNNNN`` ids).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dapo_core.answers import canonical_integer
from dapo_core.curation import Decontaminator, apply_template, dedupe_key
from dapo_core.errors import PipelineError
from dapo_core.integer_form import integerize
from dapo_core.problem import Problem
from dapo_core.records import Malformed, Row, parse_record

# Why a well-formed row is dropped (malformed-row reasons: dapo_core.records.MALFORMED).
DUPLICATE = "duplicate"
CONFLICT = "conflicting_answers"
NO_INTEGER = "no_integer_form"
CONTAMINATED = "contaminated"

RECORD_CHARS = 4000  # a rejected row's raw record is kept (as JSON) up to this length

# track(phase, total) -> advance(n): a progress callback per phase (a progress bar in tasks/)
Track = Callable[[str, int | None], Callable[[int], None]]

T = TypeVar("T")


@dataclass(frozen=True)
class Answer:
    """A problem's answer in integer form."""

    value: str  # canonical integer string
    form: str  # "integer" or the integerize form ("m/n", ...)
    instruction: str  # appended to the problem ("" for integers)


# A problem that asks for a rounded value: its decimal answer is not an exact fraction.
_ASKS_ROUNDING = re.compile(r"\bround|\bnearest\b|decimal places?|significant figures?", re.I)


def asks_rounding(problem: str) -> bool:
    return bool(_ASKS_ROUNDING.search(problem))


@functools.lru_cache(maxsize=1 << 16)
def normalize_answer(raw: str, rounded: bool = False) -> Answer | None:
    """Canonical integer, else the integer form of ``integerize``, else None (no integer form).

    A terminating decimal is an exact fraction (``0.75`` is 3/4, reported as m+n) unless the
    problem asked for a rounded value (``rounded``): then its exact value is unknown."""
    canonical = canonical_integer(raw)
    if canonical is not None:
        return Answer(canonical, "integer", "")
    found = integerize(raw, decimals_as_fractions=not rounded)
    if found is None:
        return None
    if found.form == "integer":  # "\boxed{5}", "10\%", "x=5": an integer in disguise
        return Answer(str(found.value), "integer", "")
    return Answer(str(found.value), found.form, found.instruction)


def with_instruction(problem: str, answer: Answer) -> str:
    """The problem with the integer form's instruction appended (unchanged for integers)."""
    return f"{problem} {answer.instruction}" if answer.instruction else problem


def problem_id(problem: str) -> str:
    """Stable id: the sha1 of the whitespace-free problem text, 16 hex digits."""
    return hashlib.sha1(dedupe_key(problem).encode("utf-8")).hexdigest()[:16]


@dataclass
class ProblemCopies:
    """Every row of one problem (same ``dedupe_key``); the first row is the one kept."""

    first: Row
    first_row: int
    answer: Answer | None  # the first row's answer in integer form
    copies: list[tuple[int, str, str]] = field(default_factory=list)  # (row, raw answer, agree key)

    def agree(self) -> bool:
        return len({key for _, _, key in self.copies}) == 1


@dataclass
class Curated:
    """The result of one pass: kept problems (output rows) and where every other row went."""

    input_rows: int = 0
    kept: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    dropped: Counter = field(default_factory=Counter)
    conflicting_problems: int = 0
    converted: Counter = field(default_factory=Counter)  # integerized answers kept, by form
    matches: list[dict[str, Any]] = field(default_factory=list)  # decontamination hits

    def reject(self, row: int, reason: str, detail: str, **extra: Any) -> None:
        self.dropped[reason] += 1
        self.rejected.append(
            {
                "source_row": row,
                "reason": reason,
                "detail": detail,
                "problem": extra.get("problem"),
                "answer": extra.get("answer"),
                "record": extra.get("record", ""),
            }
        )


def _record_json(rec: Any) -> str:
    if isinstance(rec, Malformed):
        return ""
    if isinstance(rec, Problem):
        rec = dataclasses.asdict(rec)
    try:
        text = json.dumps(rec, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(rec)
    return text[:RECORD_CHARS]


def _group_copies(records: Iterable[Any], out: Curated, track: Track | None) -> list[ProblemCopies]:
    """Parse every record; malformed ones are rejected, the rest grouped by problem."""
    advance = track("read", None) if track is not None else None
    groups: dict[str, ProblemCopies] = {}
    for index, rec in enumerate(records):
        out.input_rows += 1
        if advance is not None and index % 1024 == 1023:
            advance(1024)
        row = parse_record(rec)
        if isinstance(row, Malformed):
            out.reject(index, row.reason, row.detail, record=_record_json(rec))
            continue
        answer = normalize_answer(row.answer, rounded=asks_rounding(row.problem))
        # Copies agree when their normalised answers do ("023" == "23", "1/2" == "\frac12").
        agree_key = f"{answer.value}|{answer.instruction}" if answer else f"raw|{row.answer}"
        key = dedupe_key(row.problem)
        if key not in groups:
            groups[key] = ProblemCopies(row, index, answer)
        groups[key].copies.append((index, row.answer, agree_key))
    if advance is not None:
        advance(out.input_rows % 1024)
    return list(groups.values())


def _consistent(groups: list[ProblemCopies], out: Curated) -> list[ProblemCopies]:
    """The problems whose copies agree and whose answer has an integer form; rejects the rest."""
    candidates = []
    for group in groups:
        if not group.agree():
            out.conflicting_problems += 1
            answers = sorted({a for _, a, _ in group.copies})
            for row, raw, _ in group.copies:
                detail = f"{len(group.copies)} copies with answers {answers}"
                out.reject(row, CONFLICT, detail, problem=group.first.problem, answer=raw)
            continue
        out.dropped[DUPLICATE] += len(group.copies) - 1
        if group.answer is None:
            first, detail = group.first, "the answer has no integer form"
            out.reject(
                group.first_row, NO_INTEGER, detail, problem=first.problem, answer=first.answer
            )
            continue
        candidates.append(group)
    return candidates


def _decontaminator(
    eval_problems: Mapping[str, list[Problem]] | None,
    candidates: list[ProblemCopies],
    ngram: int,
    threshold: float,
) -> Decontaminator | None:
    if not eval_problems or not any(eval_problems.values()):
        return None
    texts = [p.problem for probs in eval_problems.values() for p in probs]
    ids = [f"{name}/{p.id}" for name, probs in eval_problems.items() for p in probs]
    # The candidates are the boilerplate filter: n-grams shared by many training problems
    # ("where m and n are relatively prime") say nothing about contamination.
    corpus = [g.first.problem for g in candidates]
    return Decontaminator(texts, ids, n=ngram, threshold=threshold, corpus=corpus)


def _kept_row(group: ProblemCopies, answer: Answer, source_name: str) -> dict[str, Any]:
    """The output row of a kept problem (the columns of the curated train.parquet)."""
    row = group.first
    problem = with_instruction(row.problem, answer)
    return {
        "id": row.fixed_id or problem_id(row.problem),
        "problem": problem,
        "answer": answer.value,
        "source": source_name,
        "prompt": row.prompt if row.prompt is not None else apply_template(problem),
        "source_id": row.source_id,
        "source_row": group.first_row,
        "original_answer": row.answer,
        "answer_form": answer.form,
        "copies": len(group.copies),
    }


def curate_records(
    records: Iterable[Any],
    source_name: str,
    eval_problems: Mapping[str, list[Problem]] | None = None,
    *,
    ngram: int = 8,
    threshold: float = 0.5,
    track: Track | None = None,
) -> Curated:
    """Parse, normalise, dedupe and (when eval problems are given) decontaminate ``records``.

    ``track(description, total)`` returns an ``advance(n)`` callback (a progress bar) for each
    phase. Kept problems come out in source order as output rows (see ``_kept_row``)."""
    out = Curated()
    candidates = _consistent(_group_copies(records, out, track), out)
    detector = _decontaminator(eval_problems, candidates, ngram, threshold)
    step = track("decontaminate", len(candidates)) if track and detector else None
    for group in candidates:
        row, answer = group.first, group.answer
        assert answer is not None
        if detector is not None:
            if step is not None:
                step(1)
            found = detector.best(row.problem)
            if found is not None and found[1] >= threshold:
                where, (eval_id, score) = group.first_row, found
                out.matches.append({"source_row": where, "eval": eval_id, "score": round(score, 4)})
                detail = f"matches {eval_id} (n-gram overlap {score:.2f})"
                out.reject(where, CONTAMINATED, detail, problem=row.problem, answer=row.answer)
                continue
        if answer.form != "integer":
            out.converted[answer.form] += 1
        out.kept.append(_kept_row(group, answer, source_name))
    return out


def _row_id(row: Mapping[str, Any]) -> str:
    return row["id"]


def split_validation(
    kept: list[T], val_size: int, id_of: Callable[[T], str] = _row_id
) -> tuple[list[T], list[T]]:
    """(train, val): val = the ``val_size`` items with the smallest sha1 of their id (``id_of``;
    default: the ``id`` of an output row), in that hash order; train = the rest, in input order.

    The rule depends on the ids alone, so a problem lands in the same split whatever the row
    order, and curated data and the synthetic task are split the same way."""
    if val_size <= 0:
        return kept, []
    if val_size >= len(kept):
        raise PipelineError(
            f"data.val_size ({val_size}) leaves no training problems: only {len(kept)} were "
            "kept; lower data.val_size (e.g. -S data.val_size=0)"
        )
    order = sorted(range(len(kept)), key=lambda i: hashlib.sha1(id_of(kept[i]).encode()).digest())
    chosen = set(order[:val_size])
    val = [kept[i] for i in order[:val_size]]
    train = [r for i, r in enumerate(kept) if i not in chosen]
    return train, val
