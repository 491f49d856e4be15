"""One registry per kind of algorithm entry, and the validated parameters of each entry.

An entry is a function registered under a name with its own frozen parameter dataclass:

    @POLICY_LOSSES.register("clip", ClipParams)
    def clip(batch: TokenBatch, p: ClipParams) -> tuple[Tensor, Metrics]: ...

and a config selects it by name and sets its parameters from a mapping
(:meth:`Registry.make_params`).

Defaults policy: parameter dataclasses carry defaults (the values of the paper or the peer that
introduced the entry), because a config names only what it changes. A field without a default
(e.g. ``seq_mean_token_sum_norm``'s ``max_len``) is required. Every other mistake is an error
naming the entry and the field (the nanoGPT rule: a typo is an error, not a silent default):

- an unknown entry name lists the known names;
- an unknown or missing parameter;
- a value of the wrong type (an int is accepted where a float is expected; a bool is never a
  number);
- a value out of range: each parameter dataclass checks itself in ``__post_init__`` and raises
  ``ConfigError("algo.loss clip: eps_low must be in (0, 1), got 1.5")``.

Registering a parameter class stamps it with its label (``"<kind> <name>"``, the prefix of its
messages); entries without parameters share :class:`NoParams`.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from dapo_core.config import ConfigError, did_you_mean


@dataclass(frozen=True)
class Params:
    """Base of the parameter dataclasses: a label for messages and a range check."""

    entry: ClassVar[str] = "<unregistered>"  # set by Registry.register, e.g. "algo.loss clip"
    needs_critic: ClassVar[bool] = False  # an advantage estimator that reads a critic's values

    def require(self, ok: bool, field: str, rule: str) -> None:
        """Raise ``ConfigError("<entry>: <field> <rule>, got <value>")`` unless ``ok``."""
        if not ok:
            raise ConfigError(f"{self.entry}: {field} {rule}, got {getattr(self, field)!r}")


@dataclass(frozen=True)
class NoParams(Params):
    """The parameters of an entry that has none."""


@dataclass(frozen=True)
class Entry:
    name: str
    fn: Callable[..., Any]
    params_cls: type
    doc: str  # the entry function's docstring: its formula and its source


class Registry:
    """Entries of one kind (policy losses, aggregations, ...) by name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind  # the config key it is selected by, the prefix of its messages
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, params: type) -> Callable[[Callable], Callable]:
        """Decorator: register the function under ``name`` with its parameter dataclass."""
        if name in self._entries:
            raise ValueError(f"{self.kind}: '{name}' is already registered")
        if not (dataclasses.is_dataclass(params) and issubclass(params, Params)):
            raise TypeError(f"{self.kind} {name}: params must be a Params dataclass")
        if dataclasses.fields(params):  # NoParams has nothing to validate, hence no label
            label = f"{self.kind} {name}"
            if "entry" in vars(params) and params.entry != label:
                raise TypeError(f"{params.__name__} is {params.entry}'s; subclass it for {label}")
            params.entry = label

        def decorate(fn: Callable) -> Callable:
            doc = inspect.cleandoc(fn.__doc__ or "")
            self._entries[name] = Entry(name, fn, params, doc)
            return fn

        return decorate

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            hint = did_you_mean(name, self.names())
            raise ConfigError(
                f"{self.kind}: unknown entry '{name}'{hint} (known: {', '.join(self.names())})"
            )
        return self._entries[name]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def make_params(self, name: str, values: Mapping[str, Any]) -> Params:
        """The entry's parameters from a mapping; defaults fill what it does not name."""
        return build_params(self.get(name).params_cls, values, f"{self.kind} {name}")


def build_params(cls: type, values: Mapping[str, Any], label: str) -> Any:
    """Check keys and types of ``values`` against dataclass ``cls``, then construct it (its
    ``__post_init__`` checks ranges). ``label`` prefixes the messages."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{label}: parameters must be a mapping, got {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    known = ", ".join(fields) or "none"
    for key in values:
        if key not in fields:
            hint = did_you_mean(str(key), fields)
            raise ConfigError(f"{label}: unknown parameter '{key}'{hint} (known: {known})")
    for name, f in fields.items():
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if name not in values and no_default:
            raise ConfigError(f"{label}: missing parameter '{name}' (it has no default)")
    hints = typing.get_type_hints(cls)
    coerced = {k: _coerce(v, hints[k], f"{label}: {k}") for k, v in values.items()}
    return cls(**coerced)


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against a type hint (float, int, bool, str, Literal, X | None)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    bad = ConfigError(f"{where} must be {_describe(hint)}, got {value!r}")
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            try:
                return _coerce(value, arm, where)
            except ConfigError:
                continue
        raise bad
    if hint is type(None):
        ok = value is None
    elif origin is Literal:
        ok = value in args
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        if isinstance(value, str):  # YAML 1.1 reads `1e-6` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    else:
        raise TypeError(f"{where}: unsupported parameter type {hint!r}")  # a schema bug
    if not ok:
        raise bad
    return value


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    return "null" if hint is type(None) else getattr(hint, "__name__", str(hint))


# One registry per kind; importing dapo_core.algos registers every built-in entry.
POLICY_LOSSES = Registry("algo.loss")
AGGREGATIONS = Registry("algo.aggregation")
ADVANTAGES = Registry("algo.advantage")
KL_ESTIMATORS = Registry("algo.kl.estimator")
CORRECTIONS = Registry("algo.correction")
CRITICS = Registry("algo.critic")
