"""Reading params.yaml (and overlay presets) into the typed config of ``dapo_core.config``.

The repository root is found from this file, not from the cwd, so commands work from any directory
and inside DVC's temporary experiment copies.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dapo_core.config import Config, ConfigError, did_you_mean
from dapo_core.config_loader import resolve

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PARAMS = REPO_ROOT / "params.yaml"


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``, or a :class:`ConfigError` that says what is wrong."""
    path = Path(path)
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist{_beside(path)}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a directory: give the YAML file in it") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text: give a YAML (or JSON) file") from None
    except yaml.YAMLError as e:
        kind = "JSON" if path.suffix == ".json" else "YAML"  # a run's config.json: JSON is YAML
        raise ConfigError(f"{path} is not valid {kind}: {_where_yaml_fails(e)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of sections, got {type(data).__name__}")
    return data


def _beside(path: Path) -> str:
    """The YAML files in ``path``'s folder, the closest first if it is a typo of one: a preset
    named wrong (``configs/qwen2.5-7B.yaml``) is shown its neighbours."""
    try:
        names = sorted(p.name for p in path.parent.iterdir() if p.suffix in (".yaml", ".yml"))
    except OSError:  # no such folder either
        return ""
    if not names:
        return ""
    where = path.parent
    hint = did_you_mean(path.name, names).replace("'", f"'{where}/", 1)
    return f"{hint} (the YAML files in {where}/: {', '.join(names)})"


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.safe_load``, refusing a key given twice in one mapping: YAML's parser keeps the
    last silently, so ``steps: 3`` then ``steps: 4`` trained 4 steps with no word."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def _where_yaml_fails(e: yaml.YAMLError) -> str:
    """The parser's complaint in one line (its own message quotes the text over several)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None)
    if mark is None or problem is None:
        return str(e).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"


def load_params(
    path: str | Path | None = None,
    overlays: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
) -> Config:
    """The resolved config: ``path`` (default: params.yaml at the repo root), then each overlay
    preset, then ``section.key=value`` overrides (``-S`` on the command line)."""
    path = Path(path) if path else DEFAULT_PARAMS
    layers = [(str(o), read_yaml(o)) for o in overlays]
    return resolve(read_yaml(path), layers, overrides, source=str(path))


def repo_path(relative: str | Path) -> Path:
    """A path from the config (relative to the repo root) as an absolute path."""
    p = Path(relative)
    return p if p.is_absolute() else REPO_ROOT / p
