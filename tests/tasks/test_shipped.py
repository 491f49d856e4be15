"""Shipped starting checkpoints: found for the settings they were built for, digest-checked,
used without a build, released by `dapo model build --ship`; and the warm start's stopping rule."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from dapo_core.config import ConfigError
from dapo_core.config_loader import resolve
from dapo_core.errors import PipelineError
from tasks.data.splits import splits
from tasks.determinism import MAKER_INDEPENDENT_MKL
from tasks.models import shipped, tiny, warm_start
from tasks.models.build import BUILD_RECORD, dir_digest, read_record
from tasks.params import load_params

ROOT = Path(__file__).resolve().parents[2]
PRESETS = {"tiny-arith": [], "tiny-chain": [ROOT / "configs" / "chain.yaml"]}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_finds_its_shipped_checkpoint(name):
    """The shipped checkpoints serve today's settings and training split: a change to either
    (a generator, a split rule, a tiny.* value) fails here until it is re-shipped."""
    cfg = load_params(None, PRESETS[name])
    found = shipped.find(tiny.shipped_key(cfg))
    assert found == shipped.SHIPPED_ROOT / name
    release = read_record(found)["release"]
    assert release["digest"] == dir_digest(found)
    assert release["start"]["digest"] == release["digest"]
    assert release["kernels"]["runtime.portable_kernels"] == "true"  # built where it travels


def test_the_embedded_model_starts_from_the_shipped_checkpoint_without_a_build(tmp_path):
    cfg = load_params(overrides=[f"tiny.path={tmp_path / 'built'}"])
    assert tiny.ensure_tiny_model(cfg) == shipped.SHIPPED_ROOT / "tiny-arith"
    assert not (tmp_path / "built").exists()


def test_shipped_false_or_other_settings_build_instead(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(tiny, "build_tiny", lambda cfg: built.append(cfg) or tmp_path)
    for override in ("tiny.shipped=false", "tiny.seed=7", "synthetic.num_train=799"):
        assert tiny.ensure_tiny_model(load_params(overrides=[override])) == tmp_path
    assert len(built) == 3


def _copy_release(tmp_path: Path, monkeypatch) -> Path:
    root = tmp_path / "checkpoints"
    shutil.copytree(shipped.SHIPPED_ROOT / "tiny-arith", root / "tiny-arith")
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    return root / "tiny-arith"


def test_a_damaged_checkpoint_is_refused_with_the_way_to_restore_it(tmp_path, monkeypatch):
    copy = _copy_release(tmp_path, monkeypatch)
    key = tiny.shipped_key(load_params())
    assert shipped.find(key, copy.parent) == copy
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of one weight
    weights.write_bytes(bytes(data))
    with pytest.raises(PipelineError, match="git checkout -- .*tiny-arith"):
        shipped.find(key, copy.parent)


def test_ship_then_annotate_releases_a_build_with_its_record(tiny_cfg, tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "checkpoints")
    key = tiny.shipped_key(tiny_cfg)
    assert shipped.find(key, shipped.SHIPPED_ROOT) is None
    out = shipped.ship(Path(tiny_cfg.tiny.path), "tiny-test", key, {"start": {"avg_at_k": 0.1}})
    shipped.annotate(out, reference_run={"digest": "sha256:0"})
    assert shipped.find(key, shipped.SHIPPED_ROOT) == out and shipped.is_shipped(out)
    release = read_record(out)["release"]
    assert release["key"] == key and release["digest"] == dir_digest(Path(tiny_cfg.tiny.path))
    assert release["rule"] == shipped.SELECTION_RULE and release["start"]["avg_at_k"] == 0.1
    assert release["reference_run"] == {"digest": "sha256:0"}
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny-test"]  # no staging left


@pytest.mark.parametrize("page", ["README.md", "docs/results.md"])
def test_the_docs_quote_the_shipped_releases(page):
    """The digests and starting scores the README's summary and the results page state are the
    releases' own."""
    text = (ROOT / page).read_text()
    for name in PRESETS:
        release = json.loads((shipped.SHIPPED_ROOT / name / BUILD_RECORD).read_text())["release"]
        assert release["digest"] in text, name
        assert release["reference_run"]["digests"][MAKER_INDEPENDENT_MKL] in text, name
        start = re.escape(f"{release['start']['avg_at_k']:.3f}")
        assert re.search(rf"\b{start}\b", text), name


# The stopping rule of the warm start.


def _fresh_copy(tiny_cfg, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(tiny_cfg.tiny.path, out)
    return out


def test_the_warm_start_stops_at_the_first_check_on_target(tiny_cfg, tmp_path):
    scores = iter([0.1, 0.2, 0.5, 0.9])
    rule = warm_start.StopRule(target=0.5, every=3, score=lambda model, tok: next(scores))
    train = splits(tiny_cfg).train
    result = warm_start.warm_start(
        _fresh_copy(tiny_cfg, tmp_path, "a"), train, 20, 1e-3, 4, 0, rule
    )
    assert result.steps == 9 and result.checks == [(3, 0.1), (6, 0.2), (9, 0.5)]
    assert result.landed(rule) and not result.landed(dataclasses.replace(rule, target=0.6))


def test_a_check_that_jumps_past_the_window_trains_on(tiny_cfg, tmp_path):
    """0.6 is past the target 0.5 but above its window (0.5 + 0.05): training goes on to the
    next check inside it, not to the step budget."""
    scores = iter([0.2, 0.6, 0.7, 0.52, 0.51])
    rule = warm_start.StopRule(0.5, 2, lambda model, tok: next(scores), window=0.05)
    train = splits(tiny_cfg).train
    result = warm_start.warm_start(
        _fresh_copy(tiny_cfg, tmp_path, "w"), train, 20, 1e-3, 4, 0, rule
    )
    assert result.checks == [(2, 0.2), (4, 0.6), (6, 0.7), (8, 0.52)] and result.steps == 8
    assert result.landed(rule)


@pytest.mark.parametrize(
    "score, window, lands",
    [
        (0.49, 0.0, False),
        (0.5, 0.0, True),
        (0.99, 0.0, True),
        (0.55, 0.05, True),
        (0.56, 0.05, False),
    ],
)
def test_a_check_lands_between_the_target_and_its_window(score, window, lands):
    rule = warm_start.StopRule(0.5, 10, lambda model, tok: score, window)
    assert rule.lands(score) is lands


def test_checks_do_not_change_what_the_warm_start_trains(tiny_cfg, tmp_path):
    """Sampling for a check leaves the training RNG and weights alone: stopped at step 6, the
    model is the one 6 steps without checks make."""
    train = splits(tiny_cfg).train
    checked = _fresh_copy(tiny_cfg, tmp_path, "checked")
    plain = _fresh_copy(tiny_cfg, tmp_path, "plain")
    score = warm_start.validation_score(tiny_cfg, splits(tiny_cfg).val)
    calls = []

    def counted(model, tok):
        calls.append(score(model, tok))
        return 1.0 if len(calls) == 3 else 0.0

    warm_start.warm_start(checked, train, 50, 1e-3, 4, 0, warm_start.StopRule(0.5, 2, counted))
    warm_start.warm_start(plain, train, 6, 1e-3, 4, 0)
    assert len(calls) == 3 and all(0 <= c <= 1 for c in calls)
    assert dir_digest(checked) == dir_digest(plain)


def test_a_build_that_misses_its_target_says_how_to_reach_it(tiny_cfg, tmp_path, caplog):
    cfg = resolve(
        tiny_cfg.to_dict(),
        overrides=[
            f"tiny.path={tmp_path / 'm'}",
            "tiny.warm_start_steps=2",
            "tiny.warm_start_target=0.99",
            "tiny.warm_start_eval_every=1",
        ],
    )
    torch.manual_seed(0)
    path = tiny.build_tiny(cfg)
    record = read_record(path)["build"]["warm_start"]
    assert record["steps"] == 2 and len(record["validation_checks"]) == 2
    assert "raise tiny.warm_start_steps" in caplog.text


@pytest.mark.parametrize(
    "override, message",
    [
        ("tiny.warm_start_target=1", "below 1"),
        ("tiny.warm_start_eval_every=0", ">= 1"),
        ("tiny.warm_start_window=-0.1", ">= 0"),
    ],
)
def test_stop_rule_settings_are_checked(tiny_cfg, override, message):
    with pytest.raises(ConfigError, match=message):
        resolve(tiny_cfg.to_dict(), overrides=[override])


# The commands.


def test_dapo_model_build_reports_its_build_and_that_none_ships_for_it(tmp_path):
    from typer.testing import CliRunner

    from flows.cli import app
    from tests.conftest import TINY_OVERRIDES

    sets = [a for o in [*TINY_OVERRIDES, f"tiny.path={tmp_path / 'm'}"] for a in ("-S", o)]
    out = CliRunner().invoke(app, ["model", "build", *sets])
    assert out.exit_code == 0, out.output
    digest = dir_digest(tmp_path / "m")
    assert f"built: {tmp_path / 'm'} after 30 warm-start steps; {digest}, avg@k" in out.output
    assert "no checkpoint ships for these settings" in out.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["model", "check", "-S", "tiny.seed=3"], "-S changes it (tiny.seed)"),
        (["model", "check", "-S", "train.lr=1e-3"], "drop the -S overrides"),  # not this machine
        (["model", "build", "-S", "model.name_or_path=gpt2"], "builds the embedded model"),
    ],
)
def test_model_commands_refuse_what_they_cannot_do_in_one_line(args, message):
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(app, args)
    assert out.exit_code == 2 and message in out.output and "Traceback" not in out.output


def test_the_reference_run_takes_no_settings_but_where_it_is_tracked(tiny_cfg, tmp_path):
    from dapo_core.config_loader import resolve
    from flows.models import check_reference

    elsewhere = resolve(tiny_cfg.to_dict(), overrides=["tracking.experiment_prefix=x"])
    with pytest.raises(PipelineError, match="no checkpoint ships for these settings"):
        check_reference(elsewhere, tmp_path, tiny_cfg)  # past the settings (the tests' model)


def test_a_hub_models_preset_has_no_reference_run_and_is_told_so(tmp_path):
    """It said `data/curated/train.parquet does not exist; run dapo curate` for the 7B preset,
    whose model no checkpoint is shipped for, curated or not."""
    from flows.models import check_reference

    cfg = load_params(overlays=[ROOT / "configs" / "qwen2.5-7b.yaml"])
    with pytest.raises(PipelineError, match="no checkpoint ships for these settings"):
        check_reference(cfg, tmp_path)


def _check(key: str | None, recorded: dict[str, str], portable: str = "true"):
    from flows.models import ReferenceCheck

    kernels = {"runtime.portable_kernels": portable, "runtime.rounding": str(key)}
    return ReferenceCheck("tiny-arith", key, recorded, "sha256:new", kernels)


def test_the_reference_is_the_one_recorded_for_this_machines_rounding():
    """Under MKL's AVX2 branch the bits are the CPU maker's (tasks.determinism): an Intel machine
    there is held to the digest recorded on Intel, not to AMD's; under COMPATIBLE, every maker's
    CPU to the one digest; a machine off the pins to none."""
    recorded = {"AVX2@AuthenticAMD": "sha256:amd", "AVX2@GenuineIntel": "sha256:new"}
    assert _check("AVX2@GenuineIntel", recorded).reproduced
    assert not _check("AVX2@AuthenticAMD", recorded).reproduced
    assert _check("COMPATIBLE", recorded).want is None
    assert _check(None, {**recorded, "None": "sha256:new"}).want is None
    assert _check("COMPATIBLE", {**recorded, "COMPATIBLE": "sha256:new"}).reproduced


def test_session_35s_per_maker_digests_read_as_mkl_avx2s():
    from flows.models import recorded_digests

    old = {"digests": {"AuthenticAMD": "sha256:a", "GenuineIntel": "sha256:i"}}
    assert recorded_digests(old) == {
        "AVX2@AuthenticAMD": "sha256:a",
        "AVX2@GenuineIntel": "sha256:i",
    }
    now = {"digests": {"COMPATIBLE": "sha256:c", "AVX2@AuthenticAMD": "sha256:a"}}
    assert recorded_digests(now) == now["digests"]
    assert recorded_digests({"digest": "sha256:legacy"}) == {}


def test_record_adds_the_pins_digest_and_refuses_to_replace_one(tmp_path, monkeypatch):
    """After a change of the pins (session 36: MKL's AVX2 branch to COMPATIBLE) the release has
    no digest for them: --record adds it, keeping the earlier ones; it never replaces one."""
    from flows.models import record_reference

    copy = _copy_release(tmp_path, monkeypatch)
    reference = read_record(copy)["release"]["reference_run"]
    earlier = {k: v for k, v in reference["digests"].items() if k != MAKER_INDEPENDENT_MKL}
    shipped.annotate(copy, reference_run={**reference, "digests": earlier})
    record_reference(_check(MAKER_INDEPENDENT_MKL, earlier))
    after = read_record(copy)["release"]["reference_run"]
    assert after["digests"] == {**earlier, MAKER_INDEPENDENT_MKL: "sha256:new"}
    assert after["overrides"] == ["train.steps=5", "train.checkpoint_every=0"]
    with pytest.raises(PipelineError, match="re-ship the checkpoint"):
        record_reference(_check(MAKER_INDEPENDENT_MKL, after["digests"]))  # a change of numerics
    with pytest.raises(PipelineError, match="portable kernels"):
        record_reference(_check(None, after["digests"], portable="false"))
    assert read_record(copy)["release"]["reference_run"] == after


def test_a_release_is_shipped_only_from_the_portable_kernels(monkeypatch):
    import flows.models

    kernels = {"runtime.cpu_capability": "AVX2", "runtime.onednn_isa": "AVX2"}
    monkeypatch.setattr(
        flows.models, "kernel_tags", lambda: {**kernels, "runtime.mkl_cbwr": "AVX2"}
    )
    monkeypatch.setattr(flows.models, "build_tiny", lambda cfg: pytest.fail("built off the pins"))
    with pytest.raises(PipelineError, match="ship from a CPU with AVX2"):
        flows.models.build_and_compare(load_params(), ship_as="tiny-other")


def test_model_check_under_kernels_without_a_reference_says_so_and_how_to_record_one(monkeypatch):
    from typer.testing import CliRunner

    import flows.models
    from flows.cli import app

    kernels = {
        "runtime.cpu_capability": "AVX2",
        "runtime.onednn_isa": "AVX2",
        "runtime.mkl_cbwr": "AVX2",
        "runtime.cpu_vendor": "HygonGenuine",
    }
    monkeypatch.setattr(flows.models, "kernel_tags", lambda: kernels)
    monkeypatch.setattr(flows.models, "reference_run", lambda cfg, scratch: "sha256:hygon")
    out = CliRunner().invoke(app, ["model", "check"])
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())
    assert said.startswith(
        "no reference under MKL_CBWR=AVX2 on HygonGenuine CPUs: this machine ended in sha256:hygon"
    )
    assert "(AVX2@AuthenticAMD, AVX2@GenuineIntel, COMPATIBLE)" in said
    assert "--record" not in said  # only the portable pins' digest is recorded


def test_model_check_off_the_pins_says_which_settings_to_drop(monkeypatch):
    from typer.testing import CliRunner

    import flows.models
    from flows.cli import app

    kernels = {"runtime.cpu_capability": "AVX512", "runtime.mkl_cbwr": "native"}
    monkeypatch.setattr(flows.models, "kernel_tags", lambda: kernels)
    monkeypatch.setattr(flows.models, "reference_run", lambda cfg, scratch: "sha256:own")
    out = CliRunner().invoke(app, ["model", "check"])
    assert out.exit_code == 1, out.output
    said = " ".join(out.output.split())
    assert said.startswith("not comparable: this machine ended in sha256:own")
    assert "DAPO_PORTABLE_KERNELS=0" in said and "Traceback" not in out.output


def test_a_shipped_release_records_its_reference_run_under_the_portable_pins(
    tiny_cfg, tmp_path, monkeypatch
):
    """Under the pins every maker's CPU computes the reference run's bits: the release records
    its digest once, as COMPATIBLE's (a build, its scoring and the run are stood in for)."""
    import flows.models

    root = tmp_path / "checkpoints"
    root.mkdir()
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", root)
    kernels = {"runtime.cpu_capability": "AVX2", "runtime.onednn_isa": "AVX2"}
    for vendor in ("GenuineIntel", "AuthenticAMD"):
        tags = {**kernels, "runtime.mkl_cbwr": "COMPATIBLE", "runtime.cpu_vendor": vendor}
        monkeypatch.setattr(flows.models, "kernel_tags", lambda tags=tags: tags)
        monkeypatch.setattr(flows.models, "build_tiny", lambda cfg: Path(tiny_cfg.tiny.path))
        monkeypatch.setattr(
            flows.models,
            "_start",
            lambda cfg, path, digest: flows.models.Start(digest, 0.3, (0.2, 0.4)),
        )
        monkeypatch.setattr(flows.models, "reference_run", lambda cfg, scratch: "sha256:run")
        name = f"tiny-{vendor.lower()}"
        flows.models.build_and_compare(tiny_cfg, ship_as=name)
        reference = read_record(root / name)["release"]["reference_run"]
        assert reference["digests"] == {MAKER_INDEPENDENT_MKL: "sha256:run"}, vendor
