"""``model.name_or_path`` as something ``from_pretrained`` loads: a directory or a hub id.

The one place that knows the names the project makes itself: ``tiny`` (the embedded default,
shipped under ``checkpoints/`` or built), the packaged models of ``tasks.models.fetch``
(``smollm2-135m-instruct``: fetched), local ``.gguf`` files (converted once into
``data/models/<stem>``) and ``models:/`` URIs of the MLflow Model Registry (``dapo register``).
"""

from __future__ import annotations

from pathlib import Path

from dapo_core.config import Config
from tasks.data.version import tracked_md5
from tasks.models import shipped
from tasks.models.build import is_built
from tasks.models.fetch import KNOWN, convert_gguf, fetch_model, gguf_model_dir, model_dir
from tasks.models.tiny import TINY, build_spec, ensure_tiny_model, shipped_key
from tasks.models.warm_start import ensure_warm_started
from tasks.params import repo_path
from tasks.tracking.registry import is_model_uri, model_path
from tasks.tracking.store import tracking_uri


def resolve_model_path(cfg: Config) -> str:
    """The model directory for a name the project makes (built, fetched or converted on first
    use); any other value (a directory, a hub id) as is."""
    name = cfg.model.name_or_path
    if name == TINY:
        return str(ensure_tiny_model(cfg))  # its build includes its own warm start
    if is_model_uri(name):  # a registered policy: the directory its run logged
        return model_path(name, tracking_uri(cfg))
    base = name
    if name in KNOWN:
        base = str(fetch_model(name))
    elif name.endswith(".gguf"):
        out = gguf_model_dir(name)
        if not (out / "config.json").exists():
            convert_gguf(Path(name).expanduser(), out)
        base = str(out)
    if cfg.model.warm_start_steps > 0:
        return str(ensure_warm_started(cfg, base))
    return base


def model_md5(cfg: Config) -> str | None:
    """The DVC md5 of the fetched or converted model directory ``model.name_or_path`` names
    (None for the embedded model, a plain directory or hub id, or an untracked fetch)."""
    name = cfg.model.name_or_path
    if name in KNOWN:
        return tracked_md5(model_dir(name))
    if name.endswith(".gguf"):
        return tracked_md5(gguf_model_dir(name))
    return None


def existing_model_path(cfg: Config) -> Path | None:
    """The directory ``resolve_model_path`` would train from, if it is there now and current,
    without building anything (``dapo reproduce --check-only``); None when it would first be
    built (or warm-started, fetched, converted) or is a hub id."""
    name = cfg.model.name_or_path
    if name == TINY:
        checkpoint = shipped.find(shipped_key(cfg)) if cfg.tiny.shipped else None
        path = repo_path(cfg.tiny.path)
        return checkpoint or (path if is_built(path, build_spec(cfg)) else None)
    if name in KNOWN or name.endswith(".gguf") or cfg.model.warm_start_steps > 0:
        return None
    path = Path(name).expanduser()
    return path if path.is_dir() else None
