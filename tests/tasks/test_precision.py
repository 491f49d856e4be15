"""bf16 parameters through float32 master weights: DAPO-sized updates survive, state resumes."""

import copy

import torch

from tasks.training.precision import MasterWeights, needs_master_weights


def _adamw(tensors):
    return torch.optim.AdamW(tensors, lr=1e-6, weight_decay=0.0)


def _step(params, opt, grad: float = 1.0):
    for p in params:
        p.grad = torch.full_like(p, grad)
    if isinstance(opt, MasterWeights):
        opt.master_grads()
    opt.step()
    opt.zero_grad()


def test_updates_of_lr_1e6_survive_only_through_master_weights():
    """Adam's step is ~lr per element. From 0.02 (bf16 spacing there: 2^-13 ~ 1.2e-4), 100 steps
    of 1e-6 move a bf16 parameter nowhere, but move the float32 master copy by 1e-4 and its bf16
    rounding with it."""
    start = torch.full((64,), 0.02, dtype=torch.bfloat16)
    plain = torch.nn.Parameter(start.clone())
    plain_opt = _adamw([plain])
    mixed = torch.nn.Parameter(start.clone())
    mixed_opt = MasterWeights([mixed], _adamw)
    for _ in range(100):
        _step([plain], plain_opt)
        _step([mixed], mixed_opt)
    assert torch.equal(plain.detach(), start)  # every update rounded away
    master = mixed_opt.master[0].detach()
    expected = start.float() - 100 * 1e-6
    torch.testing.assert_close(master, expected, rtol=0, atol=1e-7)  # float32 rounding
    assert torch.equal(mixed.detach(), master.to(torch.bfloat16))
    assert not torch.equal(mixed.detach(), start)


def test_master_weights_resume_exactly_and_accept_a_plain_state():
    torch.manual_seed(0)
    start = torch.randn(32, dtype=torch.bfloat16)
    a = torch.nn.Parameter(start.clone())
    opt_a = MasterWeights([a], _adamw)
    for g in (1.0, -0.5, 2.0):
        _step([a], opt_a, g)
    state = copy.deepcopy(opt_a.state_dict())  # as saved to disk: no shared tensors
    b = torch.nn.Parameter(torch.zeros_like(start))  # loading restores the weights too
    opt_b = MasterWeights([b], _adamw)
    opt_b.load_state_dict(state)
    for g in (0.3, -1.0):
        _step([a], opt_a, g)
        _step([b], opt_b, g)
    assert torch.equal(opt_a.master[0], opt_b.master[0]) and torch.equal(a, b)
    # A checkpoint written by a plain optimizer: float32 copies come from the loaded weights.
    c = torch.nn.Parameter(start.clone())
    plain = _adamw([c])
    _step([c], plain)
    d = torch.nn.Parameter(c.detach().clone())
    opt_d = MasterWeights([d], _adamw)
    with torch.no_grad():
        d.add_(1.0)  # the checkpoint's weights were loaded after the optimizer was built
    opt_d.load_state_dict(copy.deepcopy(plain.state_dict()))
    assert torch.equal(opt_d.master[0], d.detach().float())


def test_step_alone_moves_the_gradients_and_frees_the_bf16_ones():
    """Called as a plain optimizer (no master_grads() first) it still applies the gradient;
    after master_grads() the bf16 gradients are gone (the float32 ones replace them)."""
    p = torch.nn.Parameter(torch.zeros(8, dtype=torch.bfloat16))
    opt = MasterWeights([p], lambda ts: torch.optim.SGD(ts, lr=0.5))
    p.grad = torch.ones_like(p)
    opt.step()
    assert torch.equal(opt.master[0].detach(), torch.full((8,), -0.5))
    p.grad = torch.ones_like(p)
    (master,) = opt.master_grads()
    assert p.grad is None and master.grad.dtype == torch.float32
    master.grad.mul_(0.5)  # clipped between the two calls: the step must use the clipped one
    opt.step()
    assert torch.equal(opt.master[0].detach(), torch.full((8,), -0.75))


def test_master_grads_are_the_bf16_gradients_in_float32_and_skip_parameters_without_one():
    """Several shapes cast in one copy: each float32 gradient equals its bf16 one exactly (a
    widening cast), keeps its shape, and a parameter without a gradient gets none."""
    shapes = [(3, 5), (7,), (2, 2, 2)]
    params = [torch.nn.Parameter(torch.zeros(s, dtype=torch.bfloat16)) for s in shapes]
    opt = MasterWeights(params, lambda ts: torch.optim.SGD(ts, lr=0.1))
    grads = [torch.randn(s).bfloat16() for s in shapes]
    params[0].grad, params[2].grad = grads[0], grads[2]
    masters = opt.master_grads()
    assert masters[1].grad is None and all(p.grad is None for p in params)
    for k in (0, 2):
        assert masters[k].grad.shape == shapes[k] and masters[k].grad.dtype == torch.float32
        assert torch.equal(masters[k].grad, grads[k].float())


def test_a_master_weights_checkpoint_into_a_plain_optimizer_is_a_clear_error():
    import pytest

    from dapo_core.errors import PipelineError
    from tasks.training.distributed import OptimizerEngine

    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.bfloat16))
    state = MasterWeights([p], _adamw).state_dict()
    model = torch.nn.Linear(2, 2)
    engine = OptimizerEngine(model, _adamw(list(model.parameters())), 1.0, 1, 0, False)
    with pytest.raises(PipelineError, match="model.dtype"):  # the CLI's one-line errors
        engine.load_state_dict(state)


def test_trainer_uses_master_weights_for_bf16_parameters_only(tiny_cfg):
    from tasks.data.splits import splits
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.training.trainer import DAPOTrainer

    for dtype, wrapped in (("bfloat16", True), ("float32", False)):
        model, tok = load_policy(resolve_model_path(tiny_cfg), dtype)
        assert needs_master_weights(list(model.parameters())) is wrapped
        trainer = DAPOTrainer(tiny_cfg, model, tok, None, splits(tiny_cfg).train)
        assert isinstance(trainer.engine.optimizer, MasterWeights) is wrapped


def test_training_loads_weights_in_model_dtype_except_float16_and_several_ranks(tiny_cfg):
    from dapo_core.config_loader import resolve
    from tasks.training.run import weights_dtype

    for dtype, world, expected in (
        ("auto", 1, "auto"),  # bf16 on a GPU (master copies), float32 on CPU
        ("bfloat16", 1, "bfloat16"),
        ("float32", 1, "float32"),
        ("float16", 1, "float32"),  # would need loss scaling
        ("bfloat16", 2, "float32"),  # DeepSpeed's bf16 mode keeps the master copies
    ):
        cfg = resolve(tiny_cfg.to_dict(), overrides=[f"model.dtype={dtype}"])
        assert weights_dtype(cfg, world) == expected, (dtype, world)
