"""The record every data source becomes: a problem, its ground-truth answer, and the prompt to show.

Training data carries integer answers (DAPO section 3.5: curation rewrites an answer into an
integer, ``m/n`` -> ``m+n``, or drops the problem); an eval set keeps each benchmark's published
answer (an integer literal written canonically, anything else as published: ``\\frac{14}{3}``,
``(3, \\frac{\\pi}{2})``), which ``dapo_core.reward.score`` judges by exact integers, else
Math-Verify.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str
    """Stable id (the same across curation runs)."""
    problem: str
    """The bare problem text (what decontamination and dedupe compare)."""
    answer: str
    """The ground truth: a canonical integer string in training data (``023`` -> ``23``); in an
    eval set, the published answer (integer literals canonical, other answers as published)."""
    prompt: str
    """The user message the policy sees (the DAPO template around the problem, for real data)."""
    source: str
    """Where it came from (a dataset id, a file name, or ``synthetic:arith``)."""
