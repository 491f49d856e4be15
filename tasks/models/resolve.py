"""``model.name_or_path`` as something ``from_pretrained`` loads: a directory or a hub id.

The one place that knows the names the project builds itself (``tiny``: the embedded default).
"""

from __future__ import annotations

from dapo_core.config import Config
from tasks.models.tiny import TINY, ensure_tiny_model


def resolve_model_path(cfg: Config) -> str:
    """The embedded model's directory for ``tiny`` (built on first use); any other value as is."""
    if cfg.model.name_or_path == TINY:
        return str(ensure_tiny_model(cfg))
    return cfg.model.name_or_path
