import dataclasses

import pytest

from dapo_core.ablation import ABLATION_LADDER, ABLATION_SWITCHES, apply_variant
from dapo_core.algorithm import algorithm
from dapo_core.config import ConfigError, flat_settings
from dapo_core.config_loader import from_dict, parse_override, resolve
from tasks.params import DEFAULT_PARAMS, REPO_ROOT, load_params, read_yaml


@pytest.fixture(scope="module")
def base():
    return read_yaml(DEFAULT_PARAMS)


def test_default_params_load(base):
    cfg = load_params()
    assert cfg.algo.loss == {"name": "clip", "eps_low": 0.2, "eps_high": 0.28, "dual_clip_c": None}
    assert cfg.algo.aggregation.name == "token_mean" and cfg.algo.advantage.name == "grpo"
    assert cfg.algo.kl.name == "none" and cfg.algo.correction.name == "none"
    assert isinstance(cfg.train.lr, float)


def test_unknown_key_names_key_and_file(base, tmp_path):
    bad = tmp_path / "p.yaml"
    bad.write_text(DEFAULT_PARAMS.read_text().replace("cache_len:", "cache_lne:"))
    with pytest.raises(ConfigError, match=r"p\.yaml.*unknown key 'algo\.cache_lne'"):
        load_params(bad)


def test_missing_key(base):
    raw = {**base, "algo": {k: v for k, v in base["algo"].items() if k != "cache_len"}}
    with pytest.raises(ConfigError, match="missing key 'algo.cache_len'"):
        from_dict(raw)


def test_wrong_type_and_literal(base):
    with pytest.raises(ConfigError, match="'algo.clip_higher' must be bool"):
        resolve(base, overrides=["algo.clip_higher=yes"])
    with pytest.raises(ConfigError, match="'algo.on_gen_cap' must be one of"):
        resolve(base, overrides=["algo.on_gen_cap=ignore"])


def test_overrides(base):
    sets = ["algo.loss.eps_high=0.3", "train.lr=1e-6", "algo.loss.dual_clip_c=10"]
    cfg = resolve(base, overrides=sets)
    assert cfg.algo.loss.params == {"eps_low": 0.2, "eps_high": 0.3, "dual_clip_c": 10.0}
    assert cfg.train.lr == 1e-6
    with pytest.raises(ConfigError, match="unknown key 'algo.nope'"):
        resolve(base, overrides=["algo.nope=1"])
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("algo.loss.eps_high")


def test_overlay_presets(tmp_path):
    cfg = load_params(overlays=["configs/qwen2.5-32b.yaml"])
    assert cfg.rollout.group_size == 16 and cfg.rollout.max_response_len == 20480
    assert cfg.algo.cache_len == 4096 and cfg.train.prompt_batch == 512 and cfg.train.lr == 1e-6
    bad = tmp_path / "o.yaml"
    bad.write_text("train:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'train.stepz'"):
        load_params(overlays=[bad])


def test_cross_field_checks(base):
    with pytest.raises(ConfigError, match="multiple of train.mini_batch"):
        resolve(base, overrides=["train.prompt_batch=10", "train.mini_batch=4"])
    with pytest.raises(ConfigError, match="cache_len"):
        resolve(base, overrides=["algo.cache_len=9999"])
    # the key that broke the rule is blamed, and both ways out are named: it blamed params.yaml,
    # which set algo.cache_len, for a -S of rollout.max_response_len
    with pytest.raises(ConfigError) as err:
        resolve(base, overrides=["rollout.max_response_len=2"])
    said = str(err.value)
    assert said.startswith("override -S rollout.max_response_len=2: algo.cache_len (")
    assert said.endswith("lower algo.cache_len or raise rollout.max_response_len")


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.steps=0", "train.steps must be >= 1, got 0"),
        ("train.steps=-3", "train.steps must be >= 1, got -3"),
        ("eval.n_samples=0", "eval.n_samples must be >= 1"),
        ("data.val_size=-1", "data.val_size must be >= 0"),
        ("train.checkpoint_every=-2", "train.checkpoint_every must be >= 0"),
        ("train.lr=0", "train.lr must be > 0, got 0"),
        ("rollout.max_response_len=0", "rollout.max_response_len must be >= 1"),
        ("data.decontam_threshold=1.5", "data.decontam_threshold must be in"),
        ("tiny.num_kv_heads=3", "multiple of tiny.num_kv_heads"),
        ("train.seed=-1", "train.seed must be >= 0, got -1"),
        ("synthetic.seed=-2", "synthetic.seed must be >= 0"),
        ("train.out_dir=", "train.out_dir must not be empty"),
        ("tiny.vocab_size=1", "tiny.vocab_size must be >= 259, got 1"),
        ("model.name_or_path= ", "model.name_or_path must not be empty"),
    ],
)
def test_counts_sizes_and_rates_are_bounded(base, override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        resolve(base, overrides=[override])


def test_errors_name_where_the_value_came_from_and_suggest_keys(base, tmp_path):
    with pytest.raises(ConfigError, match=r"^override -S train\.lr=abc: 'train\.lr' must be float"):
        resolve(base, overrides=["train.lr=abc"])
    with pytest.raises(ConfigError, match=r"^preset\.yaml: train\.steps must be >= 1"):
        resolve(base, overlays=[("preset.yaml", {"train": {"steps": 0}})])
    typo = r"^override -S algo\.loss\.eps_hihg=0\.3: algo\.loss clip: unknown parameter 'eps_hihg'"
    with pytest.raises(ConfigError, match=typo + r"; did you mean 'eps_high'\?"):
        resolve(base, overrides=["algo.loss.eps_hihg=0.3"])
    with pytest.raises(ConfigError, match=r"did you mean 'algo\.loss\.eps_high'\?"):
        resolve(base, overlays=[("p.yaml", {"algo": {"loss": {"eps_hihg": 0.3}}})])
    broken = {**base, "algo": {**base["algo"], "loss": {"name": "clip", "eps_hihg": 0.3}}}
    with pytest.raises(ConfigError, match=r"algo.loss clip: unknown parameter 'eps_hihg'; did you"):
        resolve(broken)


def test_every_bounded_key_exists(base):
    """The bounds table names real keys (a renamed key would silently escape its check)."""
    from dapo_core.config_checks import AT_LEAST, NOT_EMPTY, POSITIVE

    for key in [*AT_LEAST, *POSITIVE, *NOT_EMPTY]:
        section, name = key.split(".")
        assert name in base[section], key


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_params("/nonexistent/params.yaml")


def test_a_mistyped_preset_is_shown_its_neighbours(tmp_path):
    (tmp_path / "qwen2.5-7b.yaml").write_text("{}")
    (tmp_path / "chain.yaml").write_text("{}")
    with pytest.raises(ConfigError) as err:
        load_params(overlays=[tmp_path / "qwen2.5-7B.yaml"])
    assert str(err.value) == (
        f"config file {tmp_path}/qwen2.5-7B.yaml does not exist; did you mean "
        f"'{tmp_path}/qwen2.5-7b.yaml'? (the YAML files in {tmp_path}/: chain.yaml, "
        "qwen2.5-7b.yaml)"
    )


@pytest.mark.parametrize(
    ("name", "candidates", "said"),
    [
        ("grop", ["grpo", "gspo", "dapo"], "; did you mean 'grpo'?"),
        ("train.step", ["train.steps", "eval.seed"], "; did you mean 'train.steps'?"),
        ("zzz", ["grpo", "dapo"], ""),  # nothing close: no guess
        ("grpo", [], ""),
    ],
)
def test_did_you_mean_names_the_closest_candidate_or_nothing(name, candidates, said):
    from dapo_core.config import did_you_mean

    assert did_you_mean(name, candidates) == said


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"train: 5\n", r"'train' must be a mapping, got 5$"),
        (b"train:\n", r"'train' must be a mapping, got None$"),
        (b"algo: 7\n", r"'algo' must be a mapping, got 7$"),
        (b"algo:\n  correction: 5\n", r"algo\.correction must be a mapping"),
        (b"train:\n  steps: [1\n", r"not valid YAML: expected ',' or '\]'.* at line 3, column 1$"),
        (b"\xff\xfe", r"is not UTF-8 text: give a YAML \(or JSON\) file$"),
        (b"train:\n  steps: 3\n  steps: 4\n", r"the key 'steps' is given twice at line 3"),
    ],
    ids=[
        "number section",
        "empty section",
        "number algo",
        "number entry",
        "bad YAML",
        "binary",
        "a key twice (the last won, unsaid)",
    ],
)
def test_a_malformed_preset_is_one_line_naming_the_file(tmp_path, text, message):
    """Malformed presets (``-c``) are one line that names the file, never a traceback."""
    preset = tmp_path / "preset.yaml"
    preset.write_bytes(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_params(overlays=[preset])
    assert "preset.yaml" in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="is a directory"):
        load_params(overlays=[tmp_path])


def test_ladder_is_cumulative_and_ends_at_full_dapo(base):
    names = list(ABLATION_LADDER)
    assert names == [
        "grpo",
        "+overlong_filtering",
        "+clip_higher",
        "+overlong_shaping",
        "+token_level_loss",
        "+dynamic_sampling",
    ]
    on_counts = [sum(ABLATION_LADDER[n].values()) for n in names]
    assert on_counts == [0, 1, 2, 3, 4, 5]
    for prev, cur in zip(names, names[1:], strict=False):
        added = {
            s for s in ABLATION_SWITCHES if ABLATION_LADDER[cur][s] and not ABLATION_LADDER[prev][s]
        }
        assert added == {cur.lstrip("+")}
    cfg = from_dict(base)
    grpo = apply_variant(cfg, "grpo")
    assert not any(getattr(grpo.algo, s) for s in ABLATION_SWITCHES)
    assert algorithm(grpo.algo).loss.params.eps_high == 0.2  # the symmetric clip
    assert algorithm(grpo.algo).aggregation.entry.name == "seq_mean_token_mean"
    assert grpo.algo.loss == cfg.algo.loss  # the ladder changes switches only
    full = apply_variant(cfg, "+dynamic_sampling")
    assert all(getattr(full.algo, s) for s in ABLATION_SWITCHES)
    assert dataclasses.replace(full, algo=cfg.algo).train == cfg.train  # only algo changes
    with pytest.raises(ConfigError, match="unknown variant"):
        apply_variant(cfg, "dapo++")


@pytest.mark.parametrize("preset", sorted(p.name for p in (REPO_ROOT / "configs").glob("*.yaml")))
def test_every_preset_resolves_and_its_overlong_buffer_fits(preset):
    cfg = load_params(overlays=[f"configs/{preset}"])
    assert 0 <= cfg.algo.cache_len < cfg.rollout.max_response_len  # Eq. 13 needs a buffer < L_max


def test_the_chain_preset_puts_long_chains_in_the_buffer():
    """configs/chain.yaml: the longest chains' reference solutions reach the soft-punishment
    buffer on average, the shortest stay far from it. Tokens are counted from below: under the
    Qwen2 pre-tokenizer every digit, "+", "=" and newline is a token of its own, and the answer
    line is at least "Answer", ":" and its digits."""
    import re

    import numpy as np

    from dapo_core.synthetic import operands, solution
    from tasks.data.sources import synthetic_problems

    def min_tokens(p):
        return len(re.findall(r"[0-9+=\n]", solution(p))) + 2

    cfg = load_params(overlays=["configs/chain.yaml"])
    train, _ = synthetic_problems(cfg)
    buffer_start = cfg.rollout.max_response_len - cfg.algo.cache_len
    longest = [min_tokens(p) for p in train if len(operands(p)) == cfg.synthetic.num_terms]
    assert np.mean(longest) > buffer_start
    shortest = [min_tokens(p) for p in train if len(operands(p)) == 2]
    assert max(shortest) < buffer_start / 2


def test_a_config_logged_before_a_key_existed_still_loads():
    """dapo reproduce and resubmitted sweep runs read configs logged by older versions: keys
    added since take the value that behaves as those runs did."""
    from dapo_core.config_loader import ADDED_KEYS, from_dict
    from tasks.params import load_params

    logged = load_params().to_dict()
    for section, key in ADDED_KEYS:
        del logged[section][key]
    cfg = from_dict(logged, source="the run's config")
    assert cfg.rollout.weights == "policy" and cfg.tiny.seed == 0
    assert cfg.tracking.switch_probe is None
    assert cfg.algo.critic == {"name": "none"}  # no critic then
    assert "weights" not in logged["rollout"]  # the caller's mapping is left as it was


def test_tis_with_vllm_needs_the_distribution_vllm_reports():
    from dapo_core.config import ConfigError
    from tasks.params import load_params

    ok = ["rollout.backend=vllm", 'algo.correction={"name": "token_tis", "cap": 2}']
    assert load_params(overrides=ok).algo.correction.params == {"cap": 2.0}  # temp. 1, top-p 1
    with pytest.raises(ConfigError, match="algo.correction needs the sampler's log-probs"):
        load_params(overrides=[*ok, "rollout.temperature=0.7"])


def test_a_cross_field_rule_blames_the_override_that_broke_it():
    from dapo_core.config import ConfigError
    from tasks.params import load_params

    with pytest.raises(ConfigError, match=r"^override -S .*: algo.correction token_tis: cap must"):
        load_params(overrides=['algo.correction={"name": "token_tis", "cap": 0.5}'])
    # prompt_batch from the preset, mini_batch from -S: the override is what to change
    with pytest.raises(ConfigError, match=r"^override -S train.mini_batch=5: train.prompt_batch"):
        load_params(overlays=["configs/chain.yaml"], overrides=["train.mini_batch=5"])


def test_switch_probe_takes_an_update_switch_only(base):
    from dapo_core.config_loader import resolve

    assert resolve(base, overrides=["tracking.switch_probe=clip_higher"]).tracking.switch_probe
    with pytest.raises(ConfigError, match="dynamic sampling changes which groups"):
        resolve(base, overrides=["tracking.switch_probe=dynamic_sampling"])
    with pytest.raises(ConfigError, match="tracking.switch_probe must be null or one of"):
        resolve(base, overrides=["tracking.switch_probe=eps_high"])


def test_update_switches_are_the_ladder_but_dynamic_sampling():
    from dapo_core.ablation import ABLATION_SWITCHES
    from dapo_core.config import UPDATE_SWITCHES

    assert set(UPDATE_SWITCHES) == set(ABLATION_SWITCHES) - {"dynamic_sampling"}


OLD_FLAT_ALGO = {"eps_low": 0.2, "eps_high": 0.25, "dual_clip_c": 3.0, "tis_cap": 2.0}


def test_a_config_logged_with_the_flat_algo_keys_loads_as_the_same_algorithm():
    """Runs logged before the algorithm entries wrote algo.eps_low/eps_high/dual_clip_c/tis_cap
    flat: they migrate to the clip loss, token_mean, grpo, no KL and token_tis."""
    from dapo_core.config_loader import from_dict
    from tasks.params import load_params

    logged = load_params().to_dict()
    entries = ("loss", "aggregation", "advantage", "kl", "correction")
    old = {k: v for k, v in logged["algo"].items() if k not in entries} | OLD_FLAT_ALGO
    cfg = from_dict({**logged, "algo": old}, source="the run's config")
    assert cfg.algo.loss == {"name": "clip", "eps_low": 0.2, "eps_high": 0.25, "dual_clip_c": 3.0}
    assert cfg.algo.correction == {"name": "token_tis", "cap": 2.0}
    assert cfg.algo.aggregation.name == "token_mean" and cfg.algo.advantage.name == "grpo"
    assert cfg.algo.kl.name == "none"
    assert "loss" not in old  # the caller's mapping is left as it was
    # an older one still, without tis_cap: no correction; the rest as the default config
    del old["tis_cap"]
    old |= {"eps_high": 0.28, "dual_clip_c": None}
    assert from_dict({**logged, "algo": old}) == load_params()


def test_algo_entries_are_validated_by_the_entry_and_overlays_replace_a_named_entry(base):
    with pytest.raises(ConfigError, match=r"algo.loss: unknown entry 'clipp'; did you mean 'clip'"):
        resolve(base, overrides=["algo.loss.name=clipp"])
    with pytest.raises(ConfigError, match=r"algo.loss gspo: unknown parameter 'dual_clip_c'"):
        resolve(base, overrides=["algo.loss.name=gspo"])  # the clip's parameters stay
    with pytest.raises(ConfigError, match=r"algo.aggregation seq_mean_token_sum_norm: missing"):
        resolve(base, overrides=['algo.aggregation={"name": "seq_mean_token_sum_norm"}'])
    with pytest.raises(ConfigError, match=r"algo.kl: unknown estimator 'k4' \(known: none, k1"):
        resolve(base, overrides=["algo.kl.name=k4"])
    with pytest.raises(ConfigError, match=r"algo.kl: beta must be >= 0, got -0.1"):
        resolve(base, overrides=['algo.kl={"name": "k3", "beta": -0.1}'])
    with pytest.raises(ConfigError, match=r"algo.kl none: takes no parameters, got \['beta'\]"):
        resolve(base, overrides=["algo.kl.beta=0.1"])  # none has no beta
    gspo = resolve(base, overlays=[("p.yaml", {"algo": {"loss": {"name": "gspo"}}})])
    assert gspo.algo.loss == {"name": "gspo", "eps_low": 3e-4, "eps_high": 4e-4}  # defaults
    assert resolve(gspo.to_dict()) == gspo  # a logged config reloads as it ran


def test_algorithm_presets_replace_entries_of_the_full_recipe(base):
    from dapo_core.ablation import ALGORITHM_PRESETS

    cfg = from_dict(base)
    assert set(ALGORITHM_PRESETS) >= {"dapo", "dr_grpo", "gspo", "cispo", "rloo", "reinforce_pp"}
    assert apply_variant(cfg, "dapo") == apply_variant(cfg, "+dynamic_sampling")
    dr = algorithm(apply_variant(cfg, "dr_grpo").algo)
    assert dr.aggregation.params.max_len == cfg.rollout.max_response_len
    assert dr.advantage.entry.name == "dr_grpo" and dr.loss.entry.name == "clip"
    gspo = algorithm(apply_variant(cfg, "gspo").algo)
    assert (gspo.loss.entry.name, gspo.aggregation.entry.name) == ("gspo", "seq_mean_token_mean")
    assert gspo.kl is None and not gspo.needs_reference
    with pytest.raises(ConfigError, match=r"unknown variant 'gpso'; Table 1 rungs: grpo.*gspo"):
        apply_variant(cfg, "gpso")


def test_kl_entry_names_its_estimator_and_beta_zero_is_off(base):
    k3 = resolve(base, overrides=['algo.kl={"name": "k3", "beta": 0.04}'])
    assert k3.algo.kl == {"name": "k3", "beta": 0.04, "where": "loss"}  # where: its default
    assert resolve(k3.to_dict()) == k3  # a logged config reloads as it ran
    alg = algorithm(k3.algo)
    assert (alg.kl.estimator, alg.kl.beta, alg.kl.where) == ("k3", 0.04, "loss")
    assert alg.kl_in_loss and not alg.kl_in_reward and "kl_mean" in alg.metric_names()
    reward = algorithm(resolve(base, overrides=['algo.kl={"name": "k1", "where": "reward"}']).algo)
    assert reward.kl_in_reward and reward.kl.beta == 1e-3  # KLParams' default
    assert "kl_mean" not in reward.metric_names()  # logged with the advantages, not the loss
    off = algorithm(resolve(base, overrides=['algo.kl={"name": "k3", "beta": 0}']).algo)
    assert off.kl is None and not off.needs_reference  # beta 0 adds nothing: no reference
    with pytest.raises(ConfigError, match=r"algo.kl k3: the estimator is the entry's name"):
        resolve(base, overrides=['algo.kl={"name": "k3", "estimator": "k1"}'])


def test_grpo_kl_preset_is_deepseekmath_grpo(base):
    """Shao et al. 2024: std-normalised group advantages, symmetric clip 0.2, the mean over a
    response's tokens then over responses, k3 KL in the loss with beta 0.04, and none of DAPO's
    data-side changes."""
    cfg = apply_variant(from_dict(base), "grpo_kl")
    a = cfg.algo
    assert not any(getattr(a, s) for s in ABLATION_SWITCHES)
    alg = algorithm(a)
    assert (alg.loss.entry.name, alg.loss.params.eps_low, alg.loss.params.eps_high) == (
        "clip",
        0.2,
        0.2,
    )
    assert alg.aggregation.entry.name == "seq_mean_token_mean"
    assert alg.advantage.entry.name == "grpo"
    assert (alg.kl.estimator, alg.kl.beta, alg.kl.where) == ("k3", 0.04, "loss")
    # the ladder's naive GRPO rung plus the KL term: the same update but for it
    grpo = apply_variant(from_dict(base), "grpo").algo
    assert dataclasses.replace(a, kl=grpo.kl, loss=grpo.loss, aggregation=grpo.aggregation) == grpo
    naive = algorithm(grpo)
    assert (naive.loss.params, naive.aggregation.entry) == (alg.loss.params, alg.aggregation.entry)


def test_ppo_preset():
    from dapo_core.ablation import ABLATION_SWITCHES, ALGORITHM_PRESETS, apply_variant
    from dapo_core.algorithm import algorithm
    from tasks.params import load_params

    assert "ppo" in ALGORITHM_PRESETS
    cfg = load_params()
    ppo = apply_variant(cfg, "ppo").algo
    assert all(getattr(ppo, s) for s in ABLATION_SWITCHES)  # DAPO's recipe around it
    assert ppo.advantage == {"name": "gae", "gamma": 1.0, "lam": 1.0, "whiten": True}
    assert ppo.loss.name == "clip" and ppo.critic.name == "value"
    alg = algorithm(ppo)
    assert alg.critic.params.cliprange_value == 0.5
    assert {"value_loss", "value_clip_frac"} <= set(alg.metric_names())
    assert "value_loss" not in algorithm(cfg.algo).metric_names()
    from tasks.tracking.provenance import variant_of

    assert variant_of(apply_variant(cfg, "ppo")) == "ppo"


@pytest.mark.parametrize("value", ["1e400", "-1e400", "nan", ".inf"])
def test_a_float_that_is_not_finite_is_refused(base, value):
    """1e400 reads as infinity and would train with an infinite learning rate."""
    with pytest.raises(ConfigError, match=r"'train\.lr' must be float, got"):
        resolve(base, overrides=[f"train.lr={value}"])


def test_flat_settings_names_each_leaf_by_its_dotted_path_and_keeps_long_values_whole():
    raw = {"a": {"b": 1, "c": "x", "d": {}}, "e": [1, 2], "f": None, "g": "y" * 600}
    assert flat_settings(raw) == {
        "a.b": "1",
        "a.c": "x",
        "a.d": "{}",  # an empty section is a value, not nothing
        "e": "[1, 2]",
        "f": "null",
        "g": "y" * 600,  # compared whole: MLflow's cut is tracking's
    }


# --- settings a run goes on with but probably does not mean (dapo_core.config_checks) ---------


def _train_settings(**train: int) -> object:
    overrides = [f"train.{k}={v}" for k, v in train.items()]
    return load_params(overrides=[*overrides, "rollout.max_prompt_len=64"])


def test_the_shipped_settings_are_not_doubtful():
    from dapo_core.config_checks import doubtful_settings
    from tasks.data.splits import splits

    for overlays in ([], *[[f"configs/{p}"] for p in ("chain.yaml", "smollm2-135m.yaml")]):
        cfg = load_params(overlays=overlays)
        assert doubtful_settings(cfg, len(splits(cfg).train)) == [], overlays


@pytest.mark.parametrize(
    ("problems", "said"),
    [(96, None), (95, "train.gen_batch is 96 but the training set has 95 problems")],
)
def test_a_batch_larger_than_the_training_set_is_named(problems, said):
    from dapo_core.config_checks import doubtful_settings

    cfg = _train_settings(prompt_batch=64, gen_batch=96, mini_batch=32)
    lines = doubtful_settings(cfg, problems)
    assert len(lines) == (said is not None) and all(line.startswith(said) for line in lines)


def test_a_prompt_batch_larger_than_the_training_set_is_named_when_gen_batch_is_smaller():
    from dapo_core.config_checks import doubtful_settings

    cfg = _train_settings(prompt_batch=64, gen_batch=64, mini_batch=32)
    (line,) = doubtful_settings(cfg, 10)
    assert line.startswith("train.prompt_batch is 64 but the training set has 10 problems")


def test_a_micro_batch_below_one_longest_sequence_is_named():
    from dapo_core.config_checks import doubtful_settings

    cfg = _train_settings()
    longest = cfg.rollout.max_prompt_len + cfg.rollout.max_response_len
    (said,) = doubtful_settings(_train_settings(micro_batch_tokens=longest - 1), 10**6)
    assert said.startswith(f"train.micro_batch_tokens is {longest - 1}, below")
    assert f"= {longest})" in said
    cfg = _train_settings(micro_batch_tokens=longest)
    assert doubtful_settings(cfg, 10**6) == []
