"""``dapo model build``: the embedded model built anew on this machine, scored, and compared with
the checkpoint the project ships for the same settings (``tasks.models.shipped``); with
``--ship NAME``, released as that checkpoint."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dapo_core import metric_names as metric
from dapo_core.config import Config, flat_settings
from dapo_core.errors import PipelineError, TrainingInterrupted
from tasks.determinism import MAKER_INDEPENDENT_MKL, rounding
from tasks.models import shipped
from tasks.models.build import library_versions, read_record
from tasks.models.tiny import TINY, build_tiny, shipped_key
from tasks.runtime import configure_torch, kernel_tags
from tasks.tracking.provenance import git_commit, git_dirty


@dataclass(frozen=True)
class Start:
    """A model's digest and its avg@k on the test split before any RL (its starting score)."""

    digest: str
    avg_at_k: float
    ci: tuple[float, float]

    def shown(self) -> str:
        low, high = self.ci
        return f"{self.digest}, avg@k {self.avg_at_k:.3f} ({low:.3f}-{high:.3f})"


@dataclass(frozen=True)
class BuildReport:
    path: Path
    built: Start
    warm_start: dict[str, Any]
    shipped_as: str | None  # the shipped checkpoint for the same settings, if any
    shipped: Start | None

    @property
    def same_as_shipped(self) -> bool:
        return self.shipped is not None and self.built.digest == self.shipped.digest


def build_and_compare(cfg: Config, ship_as: str | None = None) -> BuildReport:
    """Build the embedded model of ``cfg`` into ``tiny.path``, score it, find the shipped one
    for the same settings; with ``ship_as``, release the build under that name."""
    if cfg.model.name_or_path != TINY:
        raise PipelineError(
            f"dapo model build builds the embedded model; model.name_or_path is "
            f"{cfg.model.name_or_path!r} (use -S model.name_or_path=tiny)"
        )
    if ship_as and rounding(kernel_tags()) != MAKER_INDEPENDENT_MKL:
        raise PipelineError(
            "a release is built on the portable kernels, whose bits every x86-64 CPU with AVX2 "
            "computes; this process's are not (tag runtime.rounding): ship from a CPU with AVX2 "
            "and FMA, without DAPO_PORTABLE_KERNELS=0 or kernel settings of your own"
        )
    configure_torch(cfg.train.cpu_threads)
    path = build_tiny(cfg)
    record = read_record(path) or {}
    built = _start(cfg, path, record["digest"])
    key = shipped_key(cfg)
    ours = shipped.find(key)
    release = (read_record(ours) or {}).get("release", {}) if ours else {}
    before = Start(**release["start"]) if release.get("start") else None
    if ship_as:
        about = {
            "start": {"digest": built.digest, "avg_at_k": built.avg_at_k, "ci": list(built.ci)},
            "commit": git_commit() + (" (uncommitted changes)" if git_dirty() == "true" else ""),
            "kernels": kernel_tags(),
            "libraries": library_versions(),
        }
        out = shipped.ship(path, ship_as, key, about)
        with tempfile.TemporaryDirectory(prefix="dapo-reference-") as scratch:
            digest = reference_run(cfg, Path(scratch))  # from the checkpoint just shipped
        # under the portable pins, checked above: the digest every maker's CPU computes
        digests = {MAKER_INDEPENDENT_MKL: digest}
        reference = {"overrides": list(REFERENCE_OVERRIDES), "digests": digests}
        shipped.annotate(out, reference_run=reference)
    return BuildReport(
        path, built, record.get("build", {}).get("warm_start", {}), ours and ours.name, before
    )


def _start(cfg: Config, path: Path, digest: str) -> Start:
    from tasks.evaluation.evaluate import evaluate_model

    _, result = evaluate_model(cfg, model_path=str(path))
    m = result.metrics
    ci = (m[metric.AVG_AT_K_CI_LOW], m[metric.AVG_AT_K_CI_HIGH])
    return Start(digest, m[metric.AVG_AT_K], ci)


REFERENCE_STEPS = 5
REFERENCE_OVERRIDES = (f"train.steps={REFERENCE_STEPS}", "train.checkpoint_every=0")
"""The short reference run: ``dapo train -c PRESET -S train.steps=5 -S train.checkpoint_every=0
--no-track`` from the shipped checkpoint. Its final weights are the same bits on every machine
whose kernels round alike (``tasks.determinism.rounding``: under the portable pins, every x86-64
CPU with AVX2); the release records their digest per rounding (``reference_run.digests``:
``COMPATIBLE``, and ``AVX2@AuthenticAMD`` and ``AVX2@GenuineIntel`` for the earlier pin)."""


def reference_run(cfg: Config, scratch: Path) -> str:
    """The digest of the final weights of the reference run of ``cfg`` (run in ``scratch``)."""
    from dapo_core.config_loader import resolve
    from flows.stages import train_config
    from tasks.models.build import dir_digest
    from tasks.orchestration import without_prefect

    cfg = resolve(cfg.to_dict(), overrides=REFERENCE_OVERRIDES)
    run = str(scratch / "reference")
    try:
        with without_prefect():
            train_config(cfg, run, "reference", progress=False, resume=False, track=False)
    except TrainingInterrupted:  # its advice names the scratch directory, which goes with it
        raise TrainingInterrupted(
            "the reference run stopped; it is not kept: run the same command to start it again"
        ) from None
    return dir_digest(Path(run) / "final")


def _same_run(cfg: Config, preset: Config) -> None:
    now, then = flat_settings(cfg), flat_settings(preset)
    changed = sorted(
        k
        for k in now.keys() | then.keys()
        if now.get(k) != then.get(k) and not k.startswith(("tracking.", "train.out_dir"))
    )
    if changed:
        more = ", ..." if len(changed) > 4 else ""
        raise PipelineError(
            f"the reference run is the release's, and -S changes it ({', '.join(changed[:4])}"
            f"{more}): drop the -S overrides; pick the preset with -c"
        )


@dataclass(frozen=True)
class ReferenceCheck:
    checkpoint: str  # the shipped checkpoint's name
    key: str | None  # what decides this machine's bits (tasks.determinism.rounding)
    recorded: dict[str, str]  # the reference run's digest per rounding, as its release records
    got: str
    kernels: dict[str, str]

    @property
    def want(self) -> str | None:
        """The digest recorded for this machine's rounding (None: none recorded for it)."""
        return self.recorded.get(self.key) if self.key else None

    @property
    def reproduced(self) -> bool:
        return self.got == self.want


def recorded_digests(reference: dict) -> dict[str, str]:
    """A release's reference digests keyed by rounding (``tasks.determinism.rounding``). Session
    35's releases keyed them by CPU maker alone, all under MKL's ``AVX2`` branch."""
    return {
        key if key == MAKER_INDEPENDENT_MKL or "@" in key else f"AVX2@{key}": digest
        for key, digest in reference.get("digests", {}).items()
    }


def check_reference(cfg: Config, scratch: Path, preset: Config | None = None) -> ReferenceCheck:
    """Run the reference run from the shipped checkpoint of ``cfg`` and compare its final weights
    with the digest the release recorded for this machine's kernels (``rounding``). ``preset``:
    ``cfg`` before its -S overrides, which may change only where runs are tracked and written
    (any other setting makes another run, whose weights would differ on every machine and be
    blamed on this one's rounding)."""
    _same_run(cfg, preset or cfg)
    path = _shipped_checkpoint(cfg)
    reference = (read_record(path) or {}).get("release", {}).get("reference_run", {})
    kernels = kernel_tags()
    got = reference_run(cfg, scratch)
    return ReferenceCheck(path.name, rounding(kernels), recorded_digests(reference), got, kernels)


def record_reference(check: ReferenceCheck) -> None:
    """Record ``check``'s digest as the reference run of its rounding (maintainers: one the
    release has none for, as after a change of the pins). Refused off the portable kernels, and
    where one is recorded: a digest that no longer reproduces means the numerics changed, and the
    release is re-shipped (checkpoints/README.md)."""
    if check.kernels.get("runtime.portable_kernels") != "true":
        raise PipelineError(
            "this machine does not run the portable kernels (runtime.portable_kernels=false): "
            "its digest would hold for it alone; run on a CPU with AVX2 and FMA, without "
            "DAPO_PORTABLE_KERNELS=0 or kernel settings of your own"
        )
    if check.want is not None:
        raise PipelineError(
            f"checkpoints/{check.checkpoint} records a reference run for {check.key} "
            f"already ({check.want}); a digest that no longer reproduces is a change of "
            "numerics: re-ship the checkpoint (checkpoints/README.md)"
        )
    path = shipped.SHIPPED_ROOT / check.checkpoint
    reference = (read_record(path) or {}).get("release", {}).get("reference_run", {})
    digests = {**recorded_digests(reference), check.key: check.got}
    shipped.annotate(path, reference_run={**reference, "digests": dict(sorted(digests.items()))})


def _shipped_checkpoint(cfg: Config) -> Path:
    # only the embedded model ships (a hub model's key would read a curated split first)
    path = shipped.find(shipped_key(cfg)) if cfg.model.name_or_path == TINY else None
    if path is None:
        raise PipelineError(
            "no checkpoint ships for these settings, so there is no reference run to compare "
            "with (the presets that ship one: params.yaml and configs/chain.yaml)"
        )
    return path
