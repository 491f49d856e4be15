"""Registries, parameter validation and metric reduction (dapo_core.algos.registry, .types)."""

import dataclasses
from dataclasses import dataclass

import pytest
import torch

import dapo_core.algos as algos
from dapo_core.algos import (
    ADVANTAGES,
    AGGREGATIONS,
    CORRECTIONS,
    CRITICS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    NoParams,
    Params,
    Registry,
    TokenBatch,
    reduce_metrics,
)
from dapo_core.algos.losses import ClipParams
from dapo_core.config import ConfigError

ALL = (POLICY_LOSSES, AGGREGATIONS, ADVANTAGES, KL_ESTIMATORS, CORRECTIONS, CRITICS)


def test_importing_the_package_registers_every_builtin():
    assert POLICY_LOSSES.names() == ["cispo", "clip", "gspo"]
    assert AGGREGATIONS.names() == ["seq_mean_token_mean", "seq_mean_token_sum_norm", "token_mean"]
    assert ADVANTAGES.names() == [
        "dr_grpo",
        "gae",
        "grpo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "rloo",
    ]
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]
    assert CORRECTIONS.names() == ["none", "seq_mask", "seq_tis", "token_mask", "token_tis"]
    assert CRITICS.names() == ["value"]  # algo.critic none is checked apart, as algo.kl none


def test_every_entry_documents_its_formula_source_and_owns_its_params():
    for reg in ALL:
        for name in reg.names():
            entry = reg.get(name)
            assert entry.name == name and "Source" in entry.doc, f"{reg.kind} {name}"
            cls = entry.params_cls
            assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
            if dataclasses.fields(cls):  # its messages name this entry
                assert cls.entry == f"{reg.kind} {name}"


def test_unknown_entry_lists_the_known_names():
    with pytest.raises(ConfigError) as err:
        POLICY_LOSSES.get("clipp")
    msg = str(err.value)
    assert msg.startswith("algo.loss: unknown entry 'clipp'; did you mean 'clip'?")
    assert "(known: cispo, clip, gspo)" in msg
    with pytest.raises(ConfigError, match=r"known: k1, k2, k3"):
        KL_ESTIMATORS.make_params("kl", {})


def test_defaults_fill_what_a_config_does_not_name():
    p = POLICY_LOSSES.make_params("clip", {"eps_high": 0.3})
    assert p == ClipParams(eps_low=0.2, eps_high=0.3, dual_clip_c=None)
    assert POLICY_LOSSES.make_params("gspo", {}).eps_high == 4e-4
    assert isinstance(AGGREGATIONS.make_params("token_mean", {}), NoParams)


RANGE_ERRORS = [  # (values, the exact message); the registry and entry are the message's prefix
    ({"eps_low": 1.5}, "algo.loss clip: eps_low must be in (0, 1), got 1.5"),
    ({"eps_high": 0}, "algo.loss clip: eps_high must be > 0, got 0.0"),
    ({"dual_clip_c": 0.5}, "algo.loss clip: dual_clip_c must be null or > 1, got 0.5"),
    ({"eps_low": 0}, "algo.loss gspo: eps_low must be in (0, 1), got 0.0"),
    ({"eps_low": -1}, "algo.loss cispo: eps_low must be >= 0, got -1.0"),
    ({"max_len": 0}, "algo.aggregation seq_mean_token_sum_norm: max_len must be > 0, got 0"),
    ({"gamma": 1.1}, "algo.advantage reinforce_pp: gamma must be in [0, 1], got 1.1"),
    ({"gamma": -0.1}, "algo.advantage reinforce_pp_baseline: gamma must be in [0, 1], got -0.1"),
    ({"lam": 2}, "algo.advantage gae: lam must be in [0, 1], got 2.0"),
    ({"cap": 0.5}, "algo.correction token_tis: cap must be >= 1, got 0.5"),
    ({"cap": 0.5}, "algo.correction seq_tis: cap must be >= 1, got 0.5"),
    ({"lo": 1.5}, "algo.correction token_mask: lo must be in (0, 1], got 1.5"),
    ({"hi": 0.9}, "algo.correction seq_mask: hi must be >= 1, got 0.9"),
    ({"cliprange_value": 0}, "algo.critic value: cliprange_value must be > 0, got 0.0"),
    ({"lr": 0}, "algo.critic value: lr must be null or > 0, got 0.0"),
]


@pytest.mark.parametrize(("values", "message"), RANGE_ERRORS)
def test_out_of_range_values_name_entry_and_field(values, message):
    kind, name = message.split(":")[0].split()
    reg = next(r for r in ALL if r.kind == kind)
    with pytest.raises(ConfigError) as err:
        reg.make_params(name, values)
    assert str(err.value) == message


def test_unknown_missing_and_mistyped_parameters():
    with pytest.raises(ConfigError) as err:
        POLICY_LOSSES.make_params("clip", {"eps_lo": 0.1})
    assert str(err.value) == (
        "algo.loss clip: unknown parameter 'eps_lo'; did you mean 'eps_low'? "
        "(known: eps_low, eps_high, dual_clip_c)"
    )
    with pytest.raises(
        ConfigError, match=r"algo.aggregation token_mean: unknown .* \(known: none\)"
    ):
        AGGREGATIONS.make_params("token_mean", {"max_len": 4})
    with pytest.raises(ConfigError, match="seq_mean_token_sum_norm: missing parameter 'max_len'"):
        AGGREGATIONS.make_params("seq_mean_token_sum_norm", {})
    bad_types = [
        (POLICY_LOSSES, "clip", {"eps_low": "wide"}, "algo.loss clip: eps_low must be float"),
        (POLICY_LOSSES, "clip", {"eps_low": True}, "eps_low must be float, got True"),
        (POLICY_LOSSES, "clip", {"dual_clip_c": "x"}, "dual_clip_c must be float or null"),
        (AGGREGATIONS, "seq_mean_token_sum_norm", {"max_len": 4.0}, "max_len must be int"),
        (ADVANTAGES, "gae", {"whiten": 1}, "algo.advantage gae: whiten must be bool, got 1"),
    ]
    for reg, name, values, message in bad_types:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
            reg.make_params(name, values)
    with pytest.raises(ConfigError, match="must be a mapping"):
        POLICY_LOSSES.make_params("clip", [("eps_low", 0.1)])


def test_ints_and_yaml_strings_are_accepted_for_floats():
    p = ADVANTAGES.make_params("gae", {"gamma": 1, "lam": "95e-2"})
    assert (p.gamma, p.lam) == (1.0, 0.95) and isinstance(p.gamma, float)


def test_a_fresh_registry():
    reg = Registry("algo.test")

    @dataclass(frozen=True)
    class Scale(Params):
        k: float = 1.0

        def __post_init__(self):
            self.require(self.k > 0, "k", "must be > 0")

    @reg.register("scale", Scale)
    def scale(x, p):
        """y = k x. Source: none."""
        return x * p.k

    assert reg.get("scale").fn(2.0, reg.make_params("scale", {"k": 3})) == 6.0
    assert reg.get("scale").doc == "y = k x. Source: none."
    with pytest.raises(ValueError, match="already registered"):
        reg.register("scale", Scale)
    with pytest.raises(TypeError, match="subclass it"):  # one params class, one entry
        reg.register("scale2", Scale)
    with pytest.raises(TypeError, match="Params dataclass"):
        reg.register("plain", dict)
    with pytest.raises(ConfigError, match=r"^algo.test scale: k must be > 0, got -1.0$"):
        reg.make_params("scale", {"k": -1})


def test_reduce_metrics_sums_then_divides():
    t = torch.tensor
    parts = [
        {"clip_frac_high": (t(1.0), t(4.0)), "ratio_mean": (t(3.0), t(3.0))},
        {"clip_frac_high": (t(0.0), t(2.0)), "empty": (t(0.0), t(0.0))},
    ]
    out = reduce_metrics(parts)
    # (1 + 0) / (4 + 2), not the mean of the shares 1/4 and 0; 0/0 -> 0; ratio_mean from one part
    assert out["clip_frac_high"].item() == pytest.approx(1 / 6)
    assert out["empty"].item() == 0.0 and out["ratio_mean"].item() == 1.0


def test_token_batch_checks_shapes_and_converts_the_mask():
    x = torch.zeros(2, 3)
    assert TokenBatch(x, x, x, torch.ones(2, 3)).mask.dtype == torch.bool
    with pytest.raises(ValueError, match="advantages must have shape"):
        TokenBatch(x, x, torch.zeros(2), x)
    with pytest.raises(ValueError, match="rollout_logp must have shape"):
        TokenBatch(x, x, x, x, rollout_logp=torch.zeros(3, 2))


def test_package_exports():
    assert set(algos.__all__) <= set(dir(algos))


def test_the_docs_added_algorithm_works_as_written(monkeypatch):
    """docs/concepts/algorithms.md, "Adding an algorithm": its loss module, registered as
    written, is a valid config entry whose parameters check themselves, and its hand test passes
    (issue 24 item 6)."""
    import math
    import re

    from tasks.params import REPO_ROOT, load_params

    page = REPO_ROOT / "docs" / "concepts" / "algorithms.md"
    section = page.read_text().split("### Adding an algorithm", 1)[1]
    module, test = re.findall(r"```python\n(.*?)```", section, re.S)[:2]
    losses = algos.POLICY_LOSSES
    monkeypatch.setattr(losses, "_entries", dict(losses._entries))  # unregistered afterwards
    scope: dict = {}
    exec(compile(module, "dapo_core/algos/reinforce.py", "exec"), scope)
    cfg = load_params(overrides=['algo.loss={"name": "reinforce", "scale": 0.5}'])
    assert cfg.algo.loss.name == "reinforce" and cfg.algo.loss.params == {"scale": 0.5}
    with pytest.raises(ConfigError, match="reinforce.*scale"):
        load_params(overrides=['algo.loss={"name": "reinforce", "scale": -1}'])
    tests: dict = {}
    exec(
        compile(test, "test_algos_losses.py", "exec"),
        {**scope, "math": math, "torch": torch, "pytest": pytest},
        tests,
    )
    tests["test_reinforce_by_hand"]()
