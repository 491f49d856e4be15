"""The Hugging Face Hub: whether it can be reached, asked once, without retries.

huggingface_hub and datasets retry a request that cannot connect with back-off, a warning per
try, for most of a minute before they fail; a command that needs the hub asks here first and
fails in one line when it is out of reach.
"""

from __future__ import annotations

import functools

PROBE_S = 5.0  # seconds to wait for the hub's answer to one request


def endpoint() -> str:
    """The hub's address (``HF_ENDPOINT`` or huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT


def offline_mode() -> bool:
    """``HF_HUB_OFFLINE``: the libraries use their caches and fail at once by themselves."""
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def out_of_reach() -> str | None:
    """Why the hub cannot be reached now, or None (also in offline mode: nothing is asked)."""
    return None if offline_mode() else unreachable(endpoint())


@functools.cache
def unreachable(address: str) -> str | None:
    """Why the hub at ``address`` cannot be reached (no DNS, refused, timed out), or None once it
    answers at all: any HTTP status is an answer (a gated or missing repository is then
    explained by the library that loads it). Asked once per process and address."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(address, timeout=PROBE_S)
    except Exception as e:  # noqa: BLE001 - the HTTP client's transport errors, one class or another
        from dapo_core.errors import first_line

        return first_line(e)
    return None
