"""Which problems are train, validation and test: the one place that decides (DAPO 3.5, 4.1).

DAPO (arXiv 2503.14476) trains on curated DAPO-Math-17K (section 3.5) and reports held-out AIME
accuracy (section 4.1); a problem seen in training must never be scored as validation or test.
:func:`splits` is the only function that assigns problems to the three splits; training, the
warm start of the embedded model, validation during training and evaluation all take their
problems from it (or, for a named eval set, from :func:`eval_problems`).

- ``synthetic:`` source: the generator's train split minus the validation problems, carved out
  with the rule curation uses (``dapo_core.curation_pass.split_validation``: the
  ``data.val_size`` problems with the smallest hash of their id); test = the generator's
  held-out split (the eval set ``synthetic-test``), disjoint from train by construction.
- curated data: ``<data.out_dir>/train.parquet`` and ``val.parquet`` as ``dapo curate`` split
  them; test = the eval set ``eval.eval_set`` (curation decontaminates train against it).

Train and validation are read when :func:`splits` is called. Test is read on first access of
``Splits.test`` (then kept), so a run that only trains never needs the eval set: for curated
data it may be a hub dataset not prepared on this machine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from dapo_core.config import Config
from dapo_core.curation_pass import split_validation
from dapo_core.problem import Problem
from tasks.data.curate import curated_dir
from tasks.data.eval_sets import SYNTHETIC_TEST, eval_set_problems
from tasks.data.sources import synthetic_problems
from tasks.data.tables import load_problems


@dataclass(frozen=True)
class Splits:
    """Train, validation and test problems, pairwise disjoint.

    Built by :func:`splits`; ``test`` is computed by ``read_test`` on first access."""

    train: list[Problem]
    val: list[Problem]
    read_test: Callable[[], list[Problem]] = field(repr=False, compare=False)

    @cached_property
    def test(self) -> list[Problem]:
        """The held-out problems a run is finally scored on (read on first access)."""
        return self.read_test()


def splits(cfg: Config) -> Splits:
    """The train, validation and test problems of ``cfg`` (see the module docstring)."""
    if cfg.data.source.startswith("synthetic:"):
        return _synthetic_splits(cfg)
    return _curated_splits(cfg)


def eval_problems(cfg: Config, name_or_path: str | None = None) -> tuple[str, list[Problem]]:
    """(name, problems) of an evaluation set (default ``eval.eval_set``): ``synthetic-test`` (the
    synthetic task's test split), a name from ``data.eval_sets`` (its prepared copy under
    data/eval/), or a path to a parquet/jsonl file."""
    name = name_or_path or cfg.eval.eval_set
    if name == SYNTHETIC_TEST:
        return name, _synthetic_test(cfg)
    return eval_set_problems(cfg, name)


def _problem_id(problem: Problem) -> str:
    return problem.id


def _synthetic_test(cfg: Config) -> list[Problem]:
    # Generated after the train problems and never equal to one (dapo_core.synthetic).
    return synthetic_problems(cfg)[1]


def _synthetic_splits(cfg: Config) -> Splits:
    generated, _ = synthetic_problems(cfg)
    train, val = split_validation(generated, cfg.data.val_size, id_of=_problem_id)
    return Splits(train, val, lambda: _synthetic_test(cfg))


def _curated_splits(cfg: Config) -> Splits:
    out_dir = curated_dir(cfg)
    train = load_problems(out_dir / "train.parquet")
    val = _curated_val(out_dir / "val.parquet", cfg.data.val_size)
    return Splits(train, val, lambda: eval_problems(cfg)[1])


def _curated_val(path: Path, val_size: int) -> list[Problem]:
    """The first ``val_size`` rows of val.parquet; none when val_size is 0 or the file is absent
    (``dapo curate`` writes no val.parquet for val_size 0)."""
    if val_size <= 0 or not path.exists():
        return []
    # A smaller val_size than the data was curated with uses part of val.parquet: the rest is
    # then in no split, never in train.
    return load_problems(path)[:val_size]
