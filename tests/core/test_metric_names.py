"""The metric catalogue: the names the readers use are the ones the writers emit."""

from dapo_core import metric_names as metric
from dapo_core.ablation import ALGORITHM_PRESETS, apply_variant
from dapo_core.ablation_stats import PROBES, SIGNALS
from dapo_core.algorithm import algorithm


def _emitted_by_entries(cfg) -> set[str]:
    names = set()
    for variant in ALGORITHM_PRESETS:
        names |= set(algorithm(apply_variant(cfg, variant).algo).metric_names())
    return {metric.train(n) for n in names}


def test_every_catalogued_entry_metric_is_emitted_by_a_builtin_entry(tiny_cfg):
    emitted = _emitted_by_entries(tiny_cfg)
    assert set(metric.ENTRY_METRICS) <= emitted
    # and no trainer-side name collides with an entry's (one writer per name)
    trainer_side = set(metric.CATALOGUE) - set(metric.ENTRY_METRICS)
    assert not trainer_side & emitted


def test_the_ablation_reads_catalogued_names():
    read = {s.metric for s in SIGNALS} | {n for p in PROBES.values() for n in (p.on, p.off)}
    assert read <= set(metric.CATALOGUE)


def test_describe_covers_validation_twins_and_entry_metrics():
    assert metric.describe("val/avg_at_k").endswith(", on the validation split")
    assert metric.describe("train/value_loss").startswith("emitted by an algo entry")
    assert metric.describe(metric.ENTROPY) == metric.CATALOGUE[metric.ENTROPY]
    assert metric.describe("nonsense") == ""
