"""The critic in the trainer (``algo.critic``, the ``ppo`` preset): it starts as the policy's
transformer with a zero head, trains on its clipped value loss beside the policy, logs its
metrics, is checkpointed with exact resume, and without it nothing is written or run."""

import json

import pytest
import torch
from safetensors.torch import load_file
from trainer_factory import full_and_resumed, parity_scores, parity_trainer, without_timings

from dapo_core.ablation import apply_variant
from dapo_core.config_loader import resolve
from tasks.models.resolve import resolve_model_path
from tasks.rundir import RunDir
from tasks.training.run import run_training

VALUE_METRICS = [
    "train/value_loss",
    "train/value_clip_frac",
    "train/value_grad_norm",
    "train/value_mean",
    "train/return_mean",
    "train/explained_variance",
]


def _cfg(tiny_cfg, *overrides, variant="ppo"):
    cfg = resolve(tiny_cfg.to_dict(), overrides=["algo.dynamic_sampling=false", *overrides])
    return apply_variant(cfg, variant) if variant else cfg


def _state(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.slow
def test_the_critic_starts_as_the_policy_and_trains_apart_from_it(tiny_cfg):
    t = parity_trainer(_cfg(tiny_cfg))
    critic = t.critic.model
    policy_backbone = _state(t.model.get_decoder())
    start = _state(critic)
    # the policy's transformer (a copy: its own parameters), and a zero head: V = 0
    assert {k.removeprefix("backbone."): v for k, v in start.items() if "head" not in k}.keys() == (
        policy_backbone.keys()
    )
    assert all(torch.equal(start[f"backbone.{k}"], v) for k, v in policy_backbone.items())
    assert not set(map(id, critic.parameters())) & set(map(id, t.model.parameters()))
    assert not start["head.weight"].any() and not start["head.bias"].any()
    m1 = t.train_step().metrics
    # step 1: V = 0, so gae (gamma = lam = 1) gives returns R and nothing is explained yet
    assert m1["train/value_mean"] == 0.0 and m1["train/explained_variance"] == 0.0
    assert m1["train/value_loss"] > 0 and m1["train/value_grad_norm"] > 0
    after_one = _state(critic)
    assert not torch.equal(after_one["head.weight"], start["head.weight"])  # the head learns
    m2 = t.train_step().metrics
    assert all(k in m2 for k in VALUE_METRICS)
    assert m2["train/value_mean"] != 0.0 and m2["train/explained_variance"] != 0.0
    after_two = _state(critic)
    # from the second update on the transformer learns too (the head is no longer 0)
    moved = [k for k in start if "head" not in k and not torch.equal(after_two[k], after_one[k])]
    assert moved
    # the policy trained too, and its transformer is not the critic's
    trained = _state(t.model.get_decoder())
    assert any(not torch.equal(trained[k], policy_backbone[k]) for k in trained)
    assert any(not torch.equal(trained[k], after_two[f"backbone.{k}"]) for k in trained)


@pytest.mark.slow
def test_without_a_critic_nothing_is_built_or_logged(tiny_cfg):
    t = parity_trainer(_cfg(tiny_cfg, variant=None))
    assert t.critic is None and "value_loss" not in t.metric_names
    m = t.train_step().metrics
    assert not {"train/value_loss", "train/explained_variance", "train/value_mean"} & m.keys()


def _files(ckpt):
    return sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_with_a_critic_reproduces_the_uninterrupted_run(
    tiny_cfg, tmp_path, monkeypatch, dtype
):
    """Policy and critic weights, their optimizers (bf16: the float32 master copies) and every
    metric: the same whether the run stops after 2 steps and resumes or not."""
    parity_scores(monkeypatch)  # mixed groups from step 1
    cfg = _cfg(tiny_cfg, "train.steps=4", f"model.dtype={dtype}")
    full, rest = full_and_resumed(cfg, tmp_path)
    assert without_timings(rest.history) == without_timings(full.history)
    assert all(k in full.history[-1] for k in VALUE_METRICS)
    assert full.history[0]["train/value_mean"] == 0 and full.history[-1]["train/value_mean"] != 0
    for name in ("final/model.safetensors", "checkpoints/step_000004/critic/model.safetensors"):
        wa, wb = load_file(str(tmp_path / "full" / name)), load_file(str(tmp_path / "cut" / name))
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), name
    critic = load_file(str(tmp_path / "full" / "checkpoints/step_000004/critic/model.safetensors"))
    assert critic["head.weight"].any()  # trained
    ckpt = tmp_path / "full" / "checkpoints" / "step_000004"
    files = _files(ckpt)
    assert {"critic/model.safetensors", "critic_optimizer_rank0.pt", "optimizer_rank0.pt"} <= set(
        files
    )
    sealed = json.loads((ckpt / "COMPLETE").read_text())["files"]
    assert {"critic/model.safetensors", "critic_optimizer_rank0.pt"} <= sealed.keys()  # checksums
    oa = torch.load(ckpt / "critic_optimizer_rank0.pt")
    ob = torch.load(tmp_path / "cut" / "checkpoints" / "step_000004" / "critic_optimizer_rank0.pt")
    assert json.dumps(oa, default=str) == json.dumps(ob, default=str)  # same structure
    flat_a = [t for t in _tensors(oa)]
    flat_b = [t for t in _tensors(ob)]
    assert len(flat_a) == len(flat_b) > 0 and all(map(torch.equal, flat_a, flat_b))


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


@pytest.mark.slow
def test_a_run_without_a_critic_writes_the_checkpoint_it_always_wrote(tiny_cfg, tmp_path):
    cfg = _cfg(tiny_cfg, "train.steps=1", variant=None)
    run_training(cfg, RunDir(tmp_path / "dapo"), progress=False)
    ckpt = tmp_path / "dapo" / "checkpoints" / "step_000001"
    files = _files(ckpt)
    assert not [f for f in files if "critic" in f]
    assert {f for f in files if not f.startswith("model/")} == {
        "COMPLETE",
        "optimizer_rank0.pt",
        "trainer.pt",
    }
    # and a ppo run refuses to resume from it, in one line
    ppo = apply_variant(cfg, "ppo")
    ppo = resolve({**ppo.to_dict(), "train": {**ppo.to_dict()["train"], "steps": 2}})
    with pytest.raises(Exception, match="holds no critic"):
        run_training(ppo, RunDir(tmp_path / "dapo"), resume=True, progress=False)


@pytest.mark.slow
def test_a_critic_from_a_model_path_is_that_models_transformer(tiny_cfg):
    """``model: <dir>``: another model (here the starting model itself, by path) whose tokenizer
    is the policy's: the same critic as ``policy``."""
    path = resolve_model_path(tiny_cfg)
    cfg = _cfg(tiny_cfg)
    by_path = resolve(
        cfg.to_dict(), overrides=[f'algo.critic={{"name": "value", "model": "{path}"}}']
    )
    a, b = _state(parity_trainer(cfg).critic.model), _state(parity_trainer(by_path).critic.model)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
