"""The record every data source becomes: a problem, its integer answer, and the prompt to show."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str
    """Stable id (the same across curation runs)."""
    problem: str
    """The bare problem text (what decontamination and dedupe compare)."""
    answer: str
    """The ground truth, a canonical integer string."""
    prompt: str
    """The user message the policy sees (the DAPO template around the problem, for real data)."""
    source: str
    """Where it came from (a dataset id, a file name, or ``synthetic:arith``)."""
