"""Shared fixtures: a very small embedded model built once per session into a temp directory."""

import os

import pytest

from tasks.determinism import pin_kernels

pin_kernels()  # as every `dapo` command does, before torch is imported
import torch  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["DAPO_WARM"] = "0"  # no test command runs in a developer's warm process

TINY_OVERRIDES = [
    "synthetic.max_operand=9",
    "synthetic.num_train=60",
    "synthetic.num_test=20",
    "data.val_size=8",
    "tiny.vocab_size=300",
    "tiny.hidden_size=32",
    "tiny.intermediate_size=64",
    "tiny.num_layers=1",
    "tiny.num_heads=2",
    "tiny.num_kv_heads=1",
    "tiny.warm_start_steps=30",
    "tiny.warm_start_target=0",  # all 30 steps: no validation sampling in the fixture
    "tiny.warm_start_batch=16",
    "rollout.group_size=4",
    "rollout.max_response_len=6",
    "algo.cache_len=2",
    "train.prompt_batch=4",
    "train.gen_batch=4",
    "train.mini_batch=2",
    "train.micro_batch_tokens=64",
    "train.lr=0.01",
    "train.warmup_steps=2",
    "train.checkpoint_every=0",
]


@pytest.fixture(scope="session")
def tiny_cfg(tmp_path_factory):
    """A config whose embedded model is built (with a short warm start) in a temp dir."""
    from tasks.models.resolve import resolve_model_path
    from tasks.params import load_params

    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny") / "model"
    cfg = load_params(overrides=[*TINY_OVERRIDES, f"tiny.path={path}"])
    resolve_model_path(cfg)
    return cfg
