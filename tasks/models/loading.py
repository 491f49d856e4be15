"""Loading a policy: any Hugging Face causal LM directory or hub id, with its tokenizer set up
for generation (left padding, a pad token), and the chat prompt the policy is sampled with.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dapo_core.errors import first_line


class ModelNotFound(FileNotFoundError):
    """A model path that is neither a directory with a config.json nor a reachable hub id."""


def transformers_quietly():
    import transformers

    from tasks.runtime import quiet_transformers

    quiet_transformers()
    return transformers


def chat_prompt(tokenizer, prompt: str) -> str:
    """The user message (e.g. the DAPO template around a problem) in the model's chat template."""
    messages = [{"role": "user", "content": prompt}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def torch_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def _looks_local(name_or_path: str) -> bool:
    """A path, not a hub id (``owner/name`` or a bare name): absolute, relative with ./ or ~,
    existing, deeper than owner/name, or under a directory that exists here."""
    path = Path(name_or_path)
    return (
        path.is_absolute()
        or name_or_path.startswith((".", "~"))
        or path.exists()
        or name_or_path.count("/") > 1
        or (name_or_path.count("/") == 1 and path.parent.is_dir())
    )


@dataclass
class HandedPolicy:
    """A policy one stage loaded, which the next stage takes instead of loading it again (the
    preflight's, for the training after it). Taken once, and only by a load of the same model,
    dtype and device: a retried training loads afresh, since its first attempt trained this one."""

    name_or_path: str
    dtype: str
    device: str
    loaded: tuple[Any, Any] | None = field(default=None, repr=False)  # (model, tokenizer)

    def take(self, name_or_path: str, dtype: str, device: torch.device) -> tuple[Any, Any] | None:
        """The (model, tokenizer) if they are what a load of these would give, and not taken.
        Let go of either way: a load of something else (another dtype) must not find a second
        copy still held."""
        loaded, self.loaded = self.loaded, None
        asked = (str(name_or_path), dtype, str(device))
        return loaded if asked == (self.name_or_path, self.dtype, self.device) else None

    def drop(self) -> None:
        """Let go of the policy, taken or not."""
        self.loaded = None


def load_policy(
    name_or_path: str,
    dtype: str = "auto",
    device: str | torch.device = "cpu",
    handed: HandedPolicy | None = None,
):
    """(model, tokenizer) from a model directory or hub id (or from ``handed``, when it holds
    that load); a clear error when it is missing."""
    device = torch.device(device)
    if handed is not None and (loaded := handed.take(name_or_path, dtype, device)) is not None:
        return loaded
    refuse_reward_model(name_or_path)
    transformers = transformers_quietly()
    AutoModelForCausalLM = transformers.AutoModelForCausalLM

    with explained_load_errors(name_or_path):
        tokenizer = load_tokenizer(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, dtype=torch_dtype(dtype, device)
        ).to(device)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation appends on the right
    return model, tokenizer


@contextmanager
def explained_load_errors(name_or_path: str):
    """A load of ``name_or_path`` that fails on its files is a ``ModelNotFound`` that says what
    to do, not a traceback from transformers or safetensors."""
    from safetensors import SafetensorError

    refuse_unreachable_hub(name_or_path)
    refuse_incomplete_dir(name_or_path)
    try:
        yield
    except (OSError, ValueError, SafetensorError) as e:
        raise ModelNotFound(_unloadable(name_or_path, e)) from None


# A Hugging Face model directory's tokenizer: one of these, whatever its kind
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def refuse_incomplete_dir(name_or_path: str) -> None:
    """A ModelNotFound that says what to pass for a local path that is not a model directory:
    missing; a training run's directory (its own config.json was read as a model's); without a
    config.json; or without its tokenizer (it loaded, and sampling failed with a traceback)."""
    if not _looks_local(name_or_path):
        return
    path = Path(name_or_path).expanduser()
    if not path.exists():
        raise ModelNotFound(f"no such model directory: {name_or_path}; {_PASS}")
    if (path / "final").is_dir() or (path / "checkpoints").is_dir():
        policy = path / "final" if (path / "final").is_dir() else path / "checkpoints"
        raise ModelNotFound(f"{path} is a training run's directory; its policy is in {policy}")
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"model path {name_or_path} has no config.json; {_PASS}")
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ModelNotFound(
            f"model directory {path} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
            "copy, fetch or build it again"
        )


REWARD_MODEL_RECORD = "reward_model.json"
"""What a trained reward model's directory carries beside its weights (``tasks.models.
learned_reward``: what it was trained from, and how well it ranks)."""


def refuse_reward_model(name_or_path: str) -> None:
    """A ModelNotFound for a trained reward model given as a policy: transformers loads its
    transformer under a fresh language-model head (its score head dropped), and the command ran
    to the end on a policy that writes noise."""
    record = Path(name_or_path).expanduser() / REWARD_MODEL_RECORD
    if _looks_local(name_or_path) and record.is_file():
        raise ModelNotFound(
            f"{name_or_path} is a reward model (it scores responses, it does not write them): "
            "give a policy (a run's final/, a checkpoint, a hub id); a reward model serves "
            "training as -S rollout.reward_model=PATH"
        )


_PASS = (
    "pass a Hugging Face model directory, a hub id (e.g. Qwen/Qwen2.5-7B), or "
    "-S model.name_or_path=tiny for the embedded model"
)


def refuse_unreachable_hub(name_or_path: str) -> None:
    """A hub id whose files are not in the local cache while the hub cannot be reached is
    refused at once, in one line (``tasks.hub``)."""
    if _looks_local(name_or_path):
        return
    from huggingface_hub import try_to_load_from_cache

    from tasks import hub

    try:
        cached = isinstance(try_to_load_from_cache(name_or_path, "config.json"), str)
    except ValueError:  # not a valid repository id: the load says so
        return
    if cached or not (why := hub.out_of_reach()):
        return
    raise ModelNotFound(
        f"could not reach {hub.endpoint()} to download {name_or_path!r} ({why}); offline, use a "
        "local model directory or -S model.name_or_path=tiny"
    )


def _unloadable(name_or_path: str, error: Exception) -> str:
    """Why a model did not load, and what to do: a local directory with a file transformers or
    safetensors cannot read is damaged (a copy or download cut short); a hub id was not reached."""
    import json

    if _looks_local(name_or_path):
        said = first_line(error)
        if isinstance(error, ValueError) and not isinstance(error, json.JSONDecodeError):
            import transformers  # an architecture or setting this version does not know

            return (
                f"model directory {name_or_path} cannot be loaded by transformers "
                f"{transformers.__version__} ({said})"
            )
        return (
            f"model directory {name_or_path} cannot be loaded ({said}): a file in it is "
            "truncated or corrupt; copy, fetch or build it again"
        )
    return (
        f"could not load model {name_or_path!r} ({error.__class__.__name__}); offline, use a "
        "local model directory or -S model.name_or_path=tiny"
    )


# What transformers keeps of a load's options in a tokenizer and writes back when it is saved:
# ``local_files_only`` follows HF_HUB_OFFLINE, so a saved model directory (and the digest that
# identifies it, such as a reference run's) would depend on the saving process's environment.
LOAD_TIME_KWARGS = ("local_files_only",)


def load_tokenizer(name_or_path: str | Path, **kwargs):
    """``AutoTokenizer.from_pretrained`` without the load-time options it would save back."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    for key in LOAD_TIME_KWARGS:
        tokenizer.init_kwargs.pop(key, None)
    return tokenizer


def save_model_dir(model, tokenizer, out: Path, state_dict: dict | None = None) -> Path:
    """Save a model (``state_dict``: its full weights, gathered from ZeRO partitions) and its
    tokenizer as a Hugging Face directory. Callers write into a staging directory that they
    publish whole (``tasks.models.build.ensure_built``, checkpoints)."""
    with without_deepspeed_probe():
        model.save_pretrained(out, state_dict=state_dict)
    tokenizer.save_pretrained(out)
    readable_weights(Path(out))
    return out


def readable_weights(folder: Path) -> None:
    """The weights with the mode the process's umask gives a new file, as the directory's other
    files have: safetensors writes them owner-only (``-rw-------``), so a shared model directory
    was unreadable to the rest of a team."""
    umask = _umask()
    for weights in folder.glob("*.safetensors"):
        weights.chmod(0o666 & ~umask)


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` sets it process-wide, and a
    file another thread made meanwhile would get mode 0666); 0o022 where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


@contextmanager
def without_deepspeed_probe() -> Iterator[None]:
    """``save_pretrained`` unwraps the model with accelerate, which imports DeepSpeed (seconds
    on a CPU) to ask whether it is a ``DeepSpeedEngine``. No model is one while DeepSpeed is
    not imported, so then the question is skipped; otherwise it is asked as usual."""
    other = sys.modules.get("accelerate.utils.other")
    if "deepspeed" in sys.modules or not hasattr(other, "is_deepspeed_available"):
        yield
        return
    asked = other.is_deepspeed_available
    other.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        other.is_deepspeed_available = asked
