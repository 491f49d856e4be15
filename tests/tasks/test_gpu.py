"""GPU paths (bf16 training, the vLLM backend): skipped cleanly where CUDA or vLLM is absent; the
vLLM weight-sync logic runs everywhere against a stand-in engine."""

import pytest
import torch

from dapo_core import metric_names as metric
from dapo_core.config_loader import resolve
from tasks.rundir import RunDir

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
def test_bf16_training_step_on_gpu(tiny_cfg, tmp_path):
    from tasks.training.run import run_training

    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=2", "model.dtype=bfloat16"])
    result = run_training(cfg, RunDir(tmp_path), progress=False)
    assert result.steps == 2
    assert all(r["train/grad_norm"] == r["train/grad_norm"] for r in result.history)  # not NaN


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("lean", [True, False], ids=["lean-decode", "transformers-decode"])
def test_sampling_logprobs_equal_the_trainers_forward_on_gpu(tiny_cfg, tmp_path, lean):
    """On CUDA the lean decode step runs its unfused path (separate q/k/v and gate/up products)
    and training uses the hand-written RMSNorm backward: rollout log-probs still equal the
    trainer's (fp32)."""
    from tasks.data.splits import splits
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.generators import HFGenerator
    from tasks.training.trainer import DAPOTrainer, Sample

    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32", "cuda")
    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.dtype=float32"])
    gen = HFGenerator(model, tok, max_prompt_len=64, lean=lean)
    trainer = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    torch.manual_seed(0)
    prompts = [chat_prompt(tok, "Compute 1 + 2."), chat_prompt(tok, "Compute 10 + 20 + 3 + 4.")]
    out = gen.generate(prompts, n=3, temperature=1.0, top_p=0.9, max_new_tokens=6)
    for i, (resp, lps) in enumerate(zip(out.response_ids, out.logprobs, strict=True)):
        prompt = out.prompt_ids[i // 3]
        with torch.no_grad():
            logp, _, _ = trainer.updater.forward([Sample(prompt + resp, len(prompt), 1.0, True)])
        found = logp[0, : len(resp)].cpu()  # the forward pads a one-token response to two
        torch.testing.assert_close(found, torch.tensor(lps), rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@cuda
def test_cuda_graph_sampling_logprobs_equal_the_trainers_within_bf16_tolerance(
    tiny_cfg, monkeypatch
):
    """Rollouts from the bf16 copy through captured CUDA graphs (several attention windows, a
    padded and compacted batch) score as the fp32 trainer scores them, within bf16 rounding; a
    second call replays the graphs it captured instead of capturing new ones."""
    from tasks.data.splits import splits
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.generators import HFGenerator
    from tasks.rollout.graphs import StaticDecoder
    from tasks.training.trainer import DAPOTrainer, Sample

    monkeypatch.setattr(StaticDecoder, "WINDOW", 16)
    monkeypatch.setattr(HFGenerator, "COMPACT_AT", 0.25)
    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32", "cuda")
    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.dtype=float32"])
    gen = HFGenerator.with_weights(model, tok, 64, torch.bfloat16)
    trainer = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    prompts = [chat_prompt(tok, p.prompt) for p in splits(cfg).train[:5]]
    torch.manual_seed(0)
    out = gen.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=40)
    captured = dict(gen._static.graphs)
    assert len({key[1] for key in captured}) >= 2  # the window grew: several graphs
    gaps = []
    for i, (resp, lps) in enumerate(zip(out.response_ids, out.logprobs, strict=True)):
        prompt = out.prompt_ids[i // 4]
        with torch.no_grad():
            logp, _, _ = trainer.updater.forward([Sample(prompt + resp, len(prompt), 1.0, True)])
        gaps.append((logp[0, : len(resp)].cpu() - torch.tensor(lps)).abs())
    gaps = torch.cat(gaps)
    assert gaps.mean() < 0.02 and gaps.max() < 0.3, (gaps.mean(), gaps.max())
    torch.manual_seed(0)
    again = gen.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=40)
    assert again.response_ids == out.response_ids  # replayed graphs: the same samples
    assert all(gen._static.graphs.get(k) is g for k, g in captured.items())
    with torch.no_grad():  # an optimizer step's worth of change, copied in place
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    gen.sync_weights(model)
    moved = gen.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=40)
    assert all(gen._static.graphs.get(k) is g for k, g in captured.items())  # no recapture
    for i, (resp, lps) in enumerate(zip(moved.response_ids, moved.logprobs, strict=True)):
        prompt = moved.prompt_ids[i // 4]
        with torch.no_grad():
            logp, _, _ = trainer.updater.forward([Sample(prompt + resp, len(prompt), 1.0, True)])
        gap = (logp[0, : len(resp)].cpu() - torch.tensor(lps)).abs()
        assert gap.max() < 0.3  # the replayed graphs read the new weights


@pytest.mark.gpu
@cuda
def test_vllm_backend_matches_interface(tiny_cfg):
    pytest.importorskip("vllm")
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.vllm_backend import VLLMGenerator

    path = resolve_model_path(tiny_cfg)
    model, tok = load_policy(path, "float32", "cuda")
    gen = VLLMGenerator(path, tok, max_prompt_len=32, max_model_len=64)
    gen.sync_weights(model)
    out = gen.generate(
        [chat_prompt(tok, "Compute 1 + 2.")], n=4, temperature=1.0, top_p=1.0, max_new_tokens=6
    )
    assert len(out.response_ids) == 4 and all(len(r) <= 6 for r in out.response_ids)


def test_vllm_backend_without_vllm_is_a_clear_error(tiny_cfg):
    try:
        import vllm  # noqa: F401
    except ImportError:
        from tasks.rollout.vllm_backend import VLLMGenerator

        with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu\]'"):
            VLLMGenerator("x", None, 8, 16)
    else:
        pytest.skip("vllm is installed")


@pytest.mark.parametrize("layout", ["v1-in-process", "v0"])
def test_vllm_weight_sync_loads_every_parameter_then_resets_the_prefix_cache(tiny_cfg, layout):
    """The sync logic against a stand-in engine (no vLLM here): every trainer parameter is loaded
    into the engine's model under its transformers name, and only then is the prefix cache,
    computed with the old weights, dropped."""
    from types import SimpleNamespace

    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.vllm_backend import VLLMGenerator

    events = []

    class EngineModel:
        def load_weights(self, weights):
            events.extend(("load", name, tensor.clone()) for name, tensor in weights)

    runner = SimpleNamespace(model_runner=SimpleNamespace(model=EngineModel()))
    worker = runner if layout == "v1-in-process" else SimpleNamespace(worker=runner)
    gen = VLLMGenerator.__new__(VLLMGenerator)  # skip building a real engine
    gen.llm = SimpleNamespace(
        llm_engine=SimpleNamespace(model_executor=SimpleNamespace(driver_worker=worker)),
        reset_prefix_cache=lambda: events.append(("reset",)),
    )
    model, _ = load_policy(resolve_model_path(tiny_cfg), "float32")
    gen.sync_weights(model)
    params = dict(model.named_parameters())
    loads = [e for e in events if e[0] == "load"]
    assert [name for _, name, _ in loads] == list(params)
    for _, name, tensor in loads:
        assert torch.equal(tensor, params[name].detach())
    assert events[-1] == ("reset",) and events.count(("reset",)) == 1


@pytest.mark.gpu
@cuda
def test_a_rollout_process_on_the_same_gpu_samples_what_the_trainer_would(tiny_cfg, tmp_path):
    """``train.rollout_ranks=1`` on CUDA: the rollout process shares the GPU with the trainer and
    reads its weights from host slots. At staleness 0 it samples what the trainer would have
    sampled itself (the same rewards and lengths, step by step); at staleness 1 batch k comes
    from the weights after step k - 1 and training still moves the weights."""
    from tasks.training.run import run_training

    base = tiny_cfg.to_dict()
    steps = ["train.steps=3", "algo.dynamic_sampling=false"]
    sync = run_training(resolve(base, overrides=steps), RunDir(tmp_path / "sync"), progress=False)
    s0 = ["train.rollout_ranks=1", "rollout.max_staleness=0"]
    proc = run_training(
        resolve(base, overrides=[*steps, *s0]), RunDir(tmp_path / "s0"), progress=False
    )
    sampled = (metric.REWARD_MEAN, metric.RESPONSE_LEN_MEAN, metric.ACC_MEAN)
    for a, b in zip(sync.history, proc.history, strict=True):
        assert {k: a[k] for k in sampled} == {k: b[k] for k in sampled}
        assert b["rollout/staleness_max"] == 0.0
    s1 = ["train.rollout_ranks=1", "rollout.max_staleness=1"]
    off = run_training(
        resolve(base, overrides=[*steps, *s1]), RunDir(tmp_path / "s1"), progress=False
    )
    assert [r["rollout/staleness_mean"] for r in off.history] == [0.0, 1.0, 1.0]
    assert all(0 < r[metric.GRAD_NORM] < float("inf") for r in off.history)


def _mismatch_means(tiny_cfg, steps: dict) -> dict[str, float]:
    """Each named (decode options, sampler)'s mean |sampler - trainer| log-prob gap over the same
    prompts and seed (each side's own samples scored by the fp32 trainer)."""
    from tasks.data.splits import splits
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.rollout.generators import HFGenerator
    from tasks.training.trainer import DAPOTrainer, Sample

    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32", "cuda")
    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.dtype=float32"])
    prompts = [chat_prompt(tok, p.prompt) for p in splits(cfg).train[:8]]
    gaps = {}
    for name, (options, sampler) in steps.items():
        gen = HFGenerator.with_weights(
            model, tok, 64, torch.bfloat16, decode_options=options, sampler=sampler
        )
        trainer = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
        torch.manual_seed(0)
        out = gen.generate(prompts, n=8, temperature=1.0, top_p=1.0, max_new_tokens=48)
        found = []
        for i, (resp, lps) in enumerate(zip(out.response_ids, out.logprobs, strict=True)):
            prompt = out.prompt_ids[i // 8]
            sample = Sample(prompt + resp, len(prompt), 1.0, True)
            with torch.no_grad():
                logp, _, _ = trainer.updater.forward([sample])
            found.append((logp[0, : len(resp)].cpu() - torch.tensor(lps)).abs())
        gaps[name] = torch.cat(found)
    means = {k: float(v.mean()) for k, v in gaps.items()}
    print(f"mean |log-prob gap|: {means}")
    return means


@pytest.mark.gpu
@cuda
def test_fused_compiled_decode_is_no_further_from_the_trainer_than_the_lean_step(tiny_cfg):
    """The sampler-trainer log-prob mismatch of the default CUDA step (fused projections, SDPA,
    compiled regions and sampler), and of the step with FlexAttention, is no worse than that of
    the lean step it replaced."""
    from tasks.rollout.graphs import LEAN_OPTIONS, DecodeOptions

    means = _mismatch_means(
        tiny_cfg,
        {
            "lean": (LEAN_OPTIONS, "exact"),
            "default": (DecodeOptions(), "auto"),
            "flex": (DecodeOptions(attention="flex"), "auto"),
        },
    )
    assert means["default"] <= 1.25 * means["lean"] + 1e-4, means
    assert means["flex"] <= 1.25 * means["lean"] + 1e-4, means


@pytest.mark.gpu
@cuda
def test_autotuned_decode_is_no_further_from_the_trainer_than_the_lean_step(tiny_cfg):
    """The same for ``rollout.decode_step: flex-static-autotune``: the products' kernels chosen
    by timing sample as close to the trainer as the lean step (a device run apart from the
    other CUDA tests: max-autotune's compilations are long)."""
    from tasks.rollout.graphs import DECODE_STEPS, LEAN_OPTIONS

    means = _mismatch_means(
        tiny_cfg,
        {
            "lean": (LEAN_OPTIONS, "exact"),
            "autotune": (DECODE_STEPS["flex-static-autotune"], "auto"),
        },
    )
    assert means["autotune"] <= 1.25 * means["lean"] + 1e-4, means
