"""model.compile: the compiled training forward computes what the eager one does, and only the
training forward runs compiled code (the sampler keeps the eager modules)."""

import pytest
import torch

from dapo_core.config_loader import resolve
from tasks.training import compiled

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _trainer(tiny_cfg, device: str, mode: str):
    from tasks.data.splits import splits
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.trainer import DAPOTrainer

    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32", device)
    cfg = resolve(tiny_cfg.to_dict(), overrides=[f"model.compile={mode}", "model.dtype=float32"])
    return DAPOTrainer(cfg, model, tok, None, splits(cfg).train)


def _samples():
    from tasks.training.batches import Sample

    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    responses = [[12, 13, 14], [15, 16], [17, 18, 19, 20], [21]]
    return [
        Sample(prompts[i // 2] + r, len(prompts[i // 2]), 1.0, True)
        for i, r in enumerate(responses)
    ]


def _logp_and_grad(trainer):
    model = trainer.updater.forward.model
    model.zero_grad()
    logp, ent, mask = trainer.updater.forward(_samples())
    (logp * mask).sum().backward()
    grad = model.get_decoder().layers[0].mlp.down_proj.weight.grad.clone()
    return logp.detach(), ent, grad


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["regions", "layers"])
def test_compiled_forward_equals_the_eager_one(tiny_cfg, device, mode):
    if device == "cpu" and mode == "regions":
        pytest.skip("one CPU mode is enough: each costs a compilation (~20 s on 2 cores)")
    torch.manual_seed(0)
    lp0, ent0, g0 = _logp_and_grad(_trainer(tiny_cfg, device, "none"))
    trainer = _trainer(tiny_cfg, device, mode)
    assert compiled.whole_sequences(trainer.updater.forward.model) == (mode == "layers")
    lp1, ent1, g1 = _logp_and_grad(trainer)
    torch.testing.assert_close(lp1, lp0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ent1, ent0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(g1, g0, rtol=1e-3, atol=1e-5)


def test_only_the_training_forward_runs_compiled_code(monkeypatch):
    """A routed module calls the compiled function inside ``training_forward`` and its own
    eager forward outside it (where the sampler and its CUDA graphs call it)."""
    calls = []
    monkeypatch.setattr(
        compiled, "_compiled", lambda fn: lambda *a, **k: calls.append(1) or fn(*a, **k)
    )
    layer = torch.nn.Linear(3, 3)
    compiled._route(layer)
    x = torch.ones(1, 3)
    eager = layer(x)
    assert calls == []
    with compiled.training_forward():
        torch.testing.assert_close(layer(x), eager)
    assert calls == [1]
    layer(x)
    assert calls == [1]


def test_one_compilation_serves_every_micro_batch_shape(tiny_cfg, monkeypatch):
    """Sizes symbolic from the first call: a micro-batch's kernels do not depend on the shapes
    compiled before it (with ``dynamic=None`` the first shape gets a compilation of its own,
    which a resumed run would not run where the uninterrupted one did)."""
    from torch._dynamo.testing import CompileCounter

    from tasks.training.batches import Sample

    torch._dynamo.reset()
    counter, compile_ = CompileCounter(), torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compile_(fn, **kw, backend=counter))
    compiled._compiled.cache_clear()
    trainer = _trainer(tiny_cfg, "cpu", "layers")
    shapes = set()
    for rows, prompt, response in [(2, 4, 3), (3, 5, 7), (4, 3, 2), (2, 6, 11)]:
        samples = [Sample([*range(5, 5 + prompt), *range(20, 20 + response)], prompt, 1.0, True)]
        logp, _, _ = trainer.updater.forward(samples * rows)
        logp.sum().backward()
        shapes.add(tuple(logp.shape))
    compiled._compiled.cache_clear()
    assert len(shapes) == 4 and counter.frame_count == 1


def test_an_unknown_mode_is_refused(tiny_cfg):
    with pytest.raises(Exception, match="model.compile"):
        resolve(tiny_cfg.to_dict(), overrides=["model.compile=everything"])
