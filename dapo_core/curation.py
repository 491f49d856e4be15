"""Pure helpers for curating DAPO-Math-17K (DAPO section 3.5): template, duplicates, overlap.

DAPO (arXiv 2503.14476, section 3.5) trains on DAPO-Math-17K, whose prompts wrap each problem in
a fixed template and whose answers are integers. Curation strips the template, collapses
duplicates and removes problems that near-duplicate an evaluation problem. Public API (no I/O;
callers own the files):

- ``TEMPLATE_PREFIX``, ``TEMPLATE_SUFFIX``, ``apply_template``, ``strip_template``;
- ``dedupe_key(problem)`` -> whitespace-free key for exact-duplicate collapsing;
- ``normalize_for_overlap(text)`` and ``Decontaminator`` -> word n-gram near-duplicate detection
  against evaluation problems.

Answers are parsed elsewhere: ``dapo_core.answers`` (canonical integers) and
``dapo_core.integer_form`` (the integer forms of section 3.5).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence

__all__ = [
    "TEMPLATE_PREFIX",
    "TEMPLATE_SUFFIX",
    "Decontaminator",
    "apply_template",
    "dedupe_key",
    "normalize_for_overlap",
    "strip_template",
]

# ---------------------------------------------------------------------------------------------
# Prompt template and duplicate keys
# ---------------------------------------------------------------------------------------------

TEMPLATE_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
TEMPLATE_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def _loose(text: str) -> str:
    """Regex matching ``text`` with any run of whitespace standing for any other."""
    return r"\s+".join(re.escape(word) for word in text.split())


_PREFIX_RE = re.compile(r"^\s*" + _loose(TEMPLATE_PREFIX) + r"\s*")
_SUFFIX_RE = re.compile(r"\s*" + _loose(TEMPLATE_SUFFIX) + r"\s*$")


def apply_template(problem: str) -> str:
    """Wrap a bare problem in the DAPO prompt template (inverse of ``strip_template``)."""
    return TEMPLATE_PREFIX + problem + TEMPLATE_SUFFIX


def strip_template(prompt: str) -> str:
    """Remove the DAPO template (tolerating whitespace changes) and return the stripped problem."""
    return _SUFFIX_RE.sub("", _PREFIX_RE.sub("", prompt, count=1), count=1).strip()


def dedupe_key(problem: str) -> str:
    """Key equal for problems that differ only in whitespace (case is kept: it matters in math)."""
    return "".join(problem.split())


# ---------------------------------------------------------------------------------------------
# Decontamination by word n-gram overlap
# ---------------------------------------------------------------------------------------------

_LATEX_SPACING = re.compile(r"\\(?:left|right|displaystyle|quad|qquad|[,;:! ])|~|\\[dt](?=frac\b)")
_NON_WORD = re.compile(r"[\W_]+")


def normalize_for_overlap(text: str) -> list[str]:
    """Lowercased words with LaTeX spacing and punctuation removed: '\\frac{1}{2}' -> frac 1 2."""
    text = _LATEX_SPACING.sub(" ", text.lower())
    return _NON_WORD.sub(" ", text).split()


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    if len(words) < n:  # a short text is one gram, so exact short copies still match
        return {tuple(words)} if words else set()
    # The shifted copies have different lengths on purpose: zip stops at the last full n-gram.
    return set(zip(*(words[i:] for i in range(n)), strict=False))


class Decontaminator:
    """Flags training problems that near-duplicate an evaluation problem.

    Each eval problem is cut into word n-grams of its normalised text, indexed n-gram -> eval ids.
    Boilerplate n-grams (present in more than ``max_df`` distinct problems of the optional
    training ``corpus``, e.g. "where m and n are relatively prime positive integers find m n") are
    dropped from the index, so sharing them proves nothing. A problem matches eval problem i when
    the shared n-grams cover at least ``threshold`` of eval problem i's remaining n-grams; text
    added around a copy (a rewritten answer instruction, a preamble) therefore does not hide it.

    The default n is 8, not the 13 used for long web documents: a 60-word problem with two words
    changed keeps about 70% of its 8-grams but under half of its 13-grams, and a 20-word one far
    fewer. ~18,000 training problems against 60 eval problems take about a second on one core.
    """

    def __init__(
        self,
        eval_problems: Sequence[str],
        ids: Sequence[str] | None = None,
        *,
        n: int = 8,
        threshold: float = 0.5,
        corpus: Iterable[str] | None = None,
        max_df: int = 10,
    ) -> None:
        if n < 1 or not 0 < threshold <= 1:
            raise ValueError(f"need n >= 1 and 0 < threshold <= 1, got {n}, {threshold}")
        if ids is not None and len(ids) != len(eval_problems):
            raise ValueError("ids and eval_problems differ in length")
        self.n, self.threshold = n, threshold
        self.ids = list(ids) if ids is not None else list(eval_problems)
        grams = [_ngrams(normalize_for_overlap(p), n) for p in eval_problems]
        self.boilerplate = self._boilerplate(set().union(*grams), corpus, max_df)
        self.index: dict[tuple[str, ...], list[int]] = defaultdict(list)
        self.sizes: list[int] = []
        for i, gram_set in enumerate(grams):
            kept = gram_set - self.boilerplate
            self.sizes.append(len(kept))
            for gram in kept:
                self.index[gram].append(i)

    def _boilerplate(
        self, eval_grams: set[tuple[str, ...]], corpus: Iterable[str] | None, max_df: int
    ) -> set[tuple[str, ...]]:
        """Eval n-grams found in more than max_df distinct corpus problems."""
        if corpus is None:
            return set()
        df: dict[tuple[str, ...], int] = defaultdict(int)
        seen: set[str] = set()
        for text in corpus:
            key = dedupe_key(text)
            if key in seen:  # exact repeats would inflate df and hide a contaminated problem
                continue
            seen.add(key)
            for gram in _ngrams(normalize_for_overlap(text), self.n) & eval_grams:
                df[gram] += 1
        return {gram for gram, count in df.items() if count > max_df}

    def best(self, problem: str) -> tuple[str, float] | None:
        """(id, score) of the eval problem with the largest share of its n-grams in ``problem``."""
        grams = _ngrams(normalize_for_overlap(problem), self.n)
        if not grams:
            return None
        shared: dict[int, int] = defaultdict(int)
        for gram in grams:
            for i in self.index.get(gram, ()):
                shared[i] += 1
        if not shared:
            return None
        # Containment of the eval problem, not of the candidate: a short training problem made of
        # one common phrase ("the number of ordered triples of positive integers (a, b, c) such
        # that") would otherwise be mostly "contained" in an unrelated eval problem.
        scores = {i: c / self.sizes[i] for i, c in shared.items()}
        i = max(scores, key=scores.__getitem__)
        return self.ids[i], scores[i]

    def match(self, problem: str) -> str | None:
        """The id (or text, when no ids were given) of the eval problem matched, else None."""
        found = self.best(problem)
        return found[0] if found is not None and found[1] >= self.threshold else None
