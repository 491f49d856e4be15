"""Building a validated :class:`~dapo_core.config.Config` from nested mappings.

The base mapping (params.yaml), overlay presets (each a subset of keys) and dotted overrides in
DVC's convention: ``-S algo.loss.eps_high=0.3`` (the value is parsed as JSON, so ``1e-6`` is a
float and ``true``/``null`` work; anything else is taken as a string). Unknown and missing keys
and values of the wrong type are errors that name the key and the file. Reading files is the
caller's job (``tasks/params.py``): this module only validates nested mappings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from dapo_core.algorithm import checked_entry
from dapo_core.config import AlgoEntry, Config, ConfigError, did_you_mean
from dapo_core.config_checks import check_values


def resolve(
    base: Mapping[str, Any],
    overlays: typing.Sequence[tuple[str, Mapping[str, Any]]] = (),
    overrides: typing.Sequence[str] = (),
    source: str = "params.yaml",
) -> Config:
    """Merge overlays (``(name, mapping)``, each a subset of keys), apply ``a.b=value`` overrides,
    then validate. ``base`` is not modified."""
    raw = json.loads(json.dumps(base))  # a deep copy that also rejects non-plain values
    origins: dict[str, str] = {}  # key -> where its value came from, for error messages
    for name, overlay in overlays:
        _merge(raw, overlay, source=name, origins=origins)
    for item in overrides:
        origins[_apply_override(raw, item)] = f"override -S {item}"
    return from_dict(raw, source=source, origins=origins)


def from_dict(
    raw: Mapping[str, Any], source: str = "<dict>", origins: Mapping[str, str] | None = None
) -> Config:
    """Build and validate a :class:`Config` from nested mappings (e.g. a logged config).
    ``origins`` names where a key's value came from when not from ``source`` (an overlay, -S)."""

    def where(key: str) -> str:
        # an algorithm entry is checked whole: name the override of one of its parameters
        inner = [o for k, o in (origins or {}).items() if k.startswith(f"{key}.")]
        return (origins or {}).get(key, inner[-1] if inner else source)

    raw = stale_correction(_backfill(migrate_flat_algo(raw)), origins or {})
    cfg = _build(Config, raw, prefix="", where=where)
    check_values(cfg, source, where)
    return cfg


# Keys added after runs were logged, each with the value that behaves as runs did before it
# existed: a config logged earlier (``dapo reproduce``, a resubmitted sweep run) still loads.
ADDED_KEYS: dict[tuple[str, str], Any] = {
    ("rollout", "weights"): "policy",  # sampling from the trained weights themselves
    ("tracking", "switch_probe"): None,  # no probe
    ("tiny", "seed"): 0,  # builds before it used a run's seed; 0 is what sweeps built with
    ("tiny", "shipped"): False,  # every run built its own starting model
    ("tiny", "warm_start_target"): 0.0,  # the warm start ran all its steps
    ("tiny", "warm_start_eval_every"): 25,
    ("eval", "answer_format"): "dapo",  # the Answer line, else the last box
    ("algo", "critic"): {"name": "none"},  # no critic (none existed)
    ("train", "rollout_ranks"): 0,  # the trainer generated its own batches
    ("rollout", "max_staleness"): 0,
}


def stale_correction(raw: Mapping[str, Any], origins: Mapping[str, str]) -> Mapping[str, Any]:
    """With rollout ranks and ``rollout.max_staleness`` > 0, ``algo.correction`` becomes
    ``token_tis`` unless an overlay or ``-S`` set it: batches sampled by a policy s updates old
    are reweighted token by token by pi_old / pi_rollout, truncated at 2 (AReaL's decoupled
    objective; verl's asynchronous trainer likewise). A copy when it changes anything."""
    train, rollout = raw.get("train", {}), raw.get("rollout", {})
    algo = raw.get("algo", {})
    correction = algo.get("correction", {}) if isinstance(algo, Mapping) else None
    if not all(isinstance(s, Mapping) for s in (train, rollout, correction)):
        return raw  # not a config yet: building it says which section is not a mapping
    chosen = any(k == "algo.correction" or k.startswith("algo.correction.") for k in origins)
    stale = train.get("rollout_ranks", 0) and rollout.get("max_staleness", 0)
    if not stale or chosen or correction.get("name") != "none":
        return raw
    out = json.loads(json.dumps(raw))
    out["algo"]["correction"] = {"name": "token_tis"}
    return out


# The flat keys of ``algo`` before the algorithm entries (issue 24), and the entries that ran then.
FLAT_ALGO_KEYS = ("eps_low", "eps_high", "dual_clip_c", "tis_cap")


def migrate_flat_algo(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """A config in the old form (``algo.eps_low``, ``eps_high``, ``dual_clip_c``, ``tis_cap``)
    rewritten as the entries that behave the same: the ``clip`` loss with those clip ranges,
    ``token_mean`` (the switches then chose the aggregation, as they still do), ``grpo``
    advantages, no KL, and ``token_tis`` with cap ``tis_cap`` (or no correction). A copy; a
    config in the new form is returned as it is."""
    algo = raw.get("algo")
    if not isinstance(algo, Mapping) or "loss" in algo or not set(FLAT_ALGO_KEYS) & set(algo):
        return raw
    algo = dict(algo)
    flat = {k: algo.pop(k) for k in FLAT_ALGO_KEYS if k in algo}
    cap = flat.pop("tis_cap", None)
    algo |= {
        "loss": {"name": "clip", **flat},
        "aggregation": {"name": "token_mean"},
        "advantage": {"name": "grpo"},
        "kl": {"name": "none"},
        "correction": {"name": "none"} if cap is None else {"name": "token_tis", "cap": cap},
    }
    return {**raw, "algo": algo}


def _backfill(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """``raw`` with each absent :data:`ADDED_KEYS` key set (a copy when one is added)."""
    absent = [(s, k) for s, k in ADDED_KEYS if isinstance(raw.get(s), Mapping) and k not in raw[s]]
    if not absent:
        return raw
    raw = {name: dict(v) if isinstance(v, Mapping) else v for name, v in raw.items()}
    for section, key in absent:
        raw[section][key] = json.loads(json.dumps(ADDED_KEYS[section, key]))  # a copy
    return raw


def parse_override(item: str) -> tuple[list[str], Any]:
    """``algo.loss.eps_high=0.3`` -> (["algo", "loss", "eps_high"], 0.3); the value is JSON,
    else a str."""
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like section.key=value")
    value = value.strip()
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    return key.strip().split("."), parsed


def _merge(
    base: dict[str, Any],
    overlay: Mapping[str, Any],
    source: str,
    origins: dict[str, str],
    prefix: str = "",
) -> None:
    for key, value in overlay.items():
        if key not in base:
            hint = did_you_mean(f"{prefix}{key}", [f"{prefix}{k}" for k in base])
            raise ConfigError(
                f"{source}: unknown key '{prefix}{key}' (not in the base config){hint}"
            )
        # An overlay that names an algo entry ({name: gspo}) replaces it whole: the old entry's
        # parameters are not the new one's.
        replaces = isinstance(value, Mapping) and "name" in value
        if (
            isinstance(value, Mapping)
            and isinstance(base[key], dict)
            and _is_section(base[key])
            and not replaces
        ):
            _merge(base[key], value, source, origins, prefix=f"{prefix}{key}.")
        else:
            base[key] = value
            origins[f"{prefix}{key}"] = source


def _is_section(value: dict[str, Any]) -> bool:
    # eval_sets is a free-form mapping that an overlay replaces whole; sections are merged.
    return not all(isinstance(v, str) for v in value.values())


def _apply_override(raw: dict[str, Any], item: str) -> str:
    """Set the value an override names; returns its dotted key."""
    keys, value = parse_override(item)
    node: Any = raw
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        # An algorithm entry ({name: ..., its parameters}) lists only the parameters it sets:
        # a new one is added here and checked by the entry itself when the config is built.
        entry_param = last and isinstance(node, dict) and "name" in node
        if not isinstance(node, dict) or (k not in node and not entry_param):
            known = [".".join([*keys[:i], c]) for c in node] if isinstance(node, dict) else []
            hint = did_you_mean(".".join(keys[: i + 1]), known)
            raise ConfigError(f"override {item!r}: unknown key '{'.'.join(keys[: i + 1])}'{hint}")
        if last:
            node[k] = value
        else:
            node = node[k]
    return ".".join(keys)


def _build(cls: type, raw: Any, prefix: str, where: typing.Callable[[str], str]) -> Any:
    if not isinstance(raw, Mapping):
        section = prefix.rstrip(".") or "the top level"
        raise ConfigError(f"{where(section)}: '{section}' must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(
            f"{where(prefix + unknown[0])}: unknown key '{prefix}{unknown[0]}'"
            + (f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else "")
            + (
                did_you_mean(unknown[0], names).replace(" '", f" '{prefix}", 1)
                or f"; valid keys here: {', '.join(names)}"
            )
        )
    missing = [n for n in names if n not in raw]
    if missing:
        raise ConfigError(f"{where(prefix + missing[0])}: missing key '{prefix}{missing[0]}'")
    values = {}
    for name in names:
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(hint, raw[name], f"{prefix}{name}.", where)
        else:
            values[name] = _coerce(raw[name], hint, f"{prefix}{name}", where(f"{prefix}{name}"))
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """Check ``value`` against a type hint; ints are accepted where floats are expected."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    bad = ConfigError(f"{source}: '{key}' must be {_describe(hint)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _coerce(value, arm, key, source)
            except ConfigError:
                continue
        raise bad
    if hint is type(None):
        if value is None:
            return None
        raise bad
    if hint is AlgoEntry:  # validated by the entry itself, its messages prefixed by the source
        try:
            return checked_entry(key.split(".")[-1], value)
        except ConfigError as err:
            raise ConfigError(f"{source}: {err}") from None
    if origin is Literal:
        if value in args:
            return value
        raise bad
    if origin is list:
        if not isinstance(value, list):
            raise bad
        return [_coerce(v, args[0], f"{key}[{i}]", source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise bad
        return {
            _coerce(k, args[0], key, source): _coerce(v, args[1], f"{key}.{k}", source)
            for k, v in value.items()
        }
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if hint is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None or not math.isfinite(number):  # 1e400 reads as inf; nan compares false
            raise bad
        return number
    if hint is str:
        if isinstance(value, str):
            return value
        raise bad
    raise ConfigError(f"{source}: '{key}' has an unsupported type {hint!r}")  # schema bug


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(hint, "__name__", str(hint))
