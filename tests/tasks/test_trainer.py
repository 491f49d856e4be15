"""The training engine on a tiny model: exact resume, micro-batch invariance, fault handling."""

import json
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file

from dapo_core.ablation import apply_variant
from dapo_core.config_loader import resolve
from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator
from tasks.rundir import RunDir
from tasks.training.batches import ProblemStream, micro_batches, padding_fraction
from tasks.training.checkpoint import save_checkpoint
from tasks.training.records import RolloutLog
from tasks.training.run import run_training
from tasks.training.trainer import DAPOTrainer, TrainingStopped, warmup_lambda


def _packing_cost(batch, prompts, prompt_lens, response_lens):
    return len({prompts[i] for i in batch}) * max(prompt_lens[i] for i in batch) + len(batch) * max(
        response_lens[i] for i in batch
    )


@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 20)),  # (prompt id, response length)
        min_size=1,
        max_size=40,
    ),
    st.integers(1, 200),
)
def test_micro_batches_respect_budget_and_take_the_cheaper_packing(samples, budget):
    prompts = [g for g, _ in samples]
    prompt_lens = [3 + g for g in prompts]  # a prompt has one length
    response_lens = [n for _, n in samples]
    packs = {
        k: micro_batches(prompts, prompt_lens, response_lens, budget, packing=k)
        for k in ("best", "group", "length")
    }
    for batches in packs.values():
        assert sorted(i for b in batches for i in b) == list(range(len(samples)))
        for b in batches:
            assert len(b) == 1 or _packing_cost(b, prompts, prompt_lens, response_lens) <= budget

    def fed(batches):
        return sum(_packing_cost(b, prompts, prompt_lens, response_lens) for b in batches)

    assert fed(packs["best"]) == min(fed(packs["group"]), fed(packs["length"]))
    for g in set(prompts):  # group-major keeps a group that fits in one micro-batch
        members = [i for i, p in enumerate(prompts) if p == g]
        if _packing_cost(members, prompts, prompt_lens, response_lens) <= budget:
            assert sum(any(prompts[i] == g for i in b) for b in packs["group"]) == 1


def test_nothing_to_pack_gives_no_micro_batches():
    assert all(micro_batches([], [], [], 64, packing=k) == [] for k in ("best", "group", "length"))


def test_length_major_packing_wins_on_varied_long_responses():
    # Two prompts of 2 tokens, each with one 100-token and three 1-token responses, budget 210.
    # By length: the two long ones together (2 x 2 + 2 x 100 = 204 fed), then the six short ones
    # (2 x 2 + 6 x 1 = 10): no padding. Whole groups do not fit, and group order pairs a long
    # response with a short one, padded to 100: [0, 1] [2, 3] [4, 5] [6, 7], 412 fed for 214.
    prompts, prompt_lens = [0, 0, 0, 0, 1, 1, 1, 1], [2] * 8
    response_lens = [100, 1, 1, 1, 100, 1, 1, 1]
    best = micro_batches(prompts, prompt_lens, response_lens, budget=210)
    assert sorted(map(sorted, best)) == [[0, 4], [1, 2, 3, 5, 6, 7]]
    assert padding_fraction(prompts, prompt_lens, response_lens, best) == 0.0
    group = micro_batches(prompts, prompt_lens, response_lens, 210, packing="group")
    assert sorted(map(sorted, group)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    frac = padding_fraction(prompts, prompt_lens, response_lens, group)
    assert frac == pytest.approx(1 - 214 / 412)


def test_micro_batches_count_a_shared_prompt_once():
    # Two prompts of 10 tokens, 4 responses of 5 each: 2*10 + 8*5 = 60 tokens shared, 120 whole.
    batches = micro_batches([0, 0, 0, 0, 1, 1, 1, 1], [10] * 8, [5] * 8, budget=60)
    assert len(batches) == 1
    assert len(micro_batches([0, 0, 0, 0, 1, 1, 1, 1], [10] * 8, [5] * 8, budget=59)) == 2


def test_warmup_never_trains_at_zero():
    f = warmup_lambda(4)
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_lambda(0)(0) == 1.0


def test_problem_stream_resumes_in_place():
    from dapo_core.synthetic import arith_problems

    problems, _ = arith_problems(0, 10, 0, 9, 2)
    a = ProblemStream(problems, seed=1)
    a.take(7)
    b = ProblemStream(problems, seed=1)
    b.load_state_dict(a.state_dict())
    assert [p.id for p in a.take(12)] == [p.id for p in b.take(12)]  # crosses an epoch


def _trainer(cfg, tmp_path, sgd=False):
    from tasks.data.splits import splits
    from tasks.rollout.generators import HFGenerator

    model, tok = load_policy(resolve_model_path(cfg), "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    # SGD(lr=1): the update is the accumulated gradient itself (Adam's first step is
    # ~lr * sign(g), which would amplify float noise in near-zero gradients).
    opt = torch.optim.SGD(model.parameters(), lr=1.0) if sgd else None
    return DAPOTrainer(cfg, model, tok, gen, splits(cfg).train, optimizer=opt)


def _weights(run_dir):
    return load_file(str(run_dir / "final" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_reproduces_uninterrupted_run(tiny_cfg, tmp_path, dtype, monkeypatch):
    """bfloat16: weights in bf16, float32 master copies in the optimizer's checkpoint. A reward
    the tiny model earns from step 1 (response-length parity): every step updates, so a resume
    that lost the optimizer's state (or anything else an update reads) would differ."""
    from tasks.training import rollouts

    monkeypatch.setattr(rollouts, "rule_correctness", lambda r, _: float(len(r) % 2 == 0))
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.steps=4", f"model.dtype={dtype}"])
    full = run_training(cfg, RunDir(tmp_path / "full"), progress=False)
    assert all(r["train/kept_group_frac"] > 0 for r in full.history)  # real updates each step
    first = run_training(cfg, RunDir(tmp_path / "cut"), progress=False, max_steps=2)
    assert first.steps == 2 and not (tmp_path / "cut" / "final").exists()
    with pytest.raises(FileExistsError, match="--resume"):
        run_training(cfg, RunDir(tmp_path / "cut"), progress=False)
    rest = run_training(cfg, RunDir(tmp_path / "cut"), resume=True, progress=False)
    assert rest.steps == 4

    def strip(h):  # timings differ between runs; everything else must match exactly
        return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in h]

    assert strip(rest.history) == strip(full.history)
    wa, wb = _weights(tmp_path / "full"), _weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert len(RunDir(tmp_path / "cut").checkpoints()) <= cfg.train.keep_checkpoints


def _mixed_groups(t):
    """Real rollouts with a fixed mixed correctness pattern, so every group carries signal."""
    torch.manual_seed(0)
    log = RolloutLog()
    groups, _ = t.rollouts.generate(4, log)
    for i, g in enumerate(groups):
        g.acc = [(i + j) % 3 == 0 for j in range(len(g.acc))]
    return groups


@pytest.mark.slow
def test_update_is_invariant_to_micro_batch_size(tiny_cfg, tmp_path):
    """The global normalizer makes accumulation over micro-batches equal one big batch."""
    results = {}
    for variant in ("+dynamic_sampling", "grpo"):  # token-level and sample-level losses
        for budget in (10_000, 8):
            cfg = apply_variant(
                resolve(tiny_cfg.to_dict(), overrides=[f"train.micro_batch_tokens={budget}"]),
                variant,
            )
            t = _trainer(cfg, tmp_path / f"{budget}{variant}", sgd=True)
            before = {k: v.clone() for k, v in t.model.state_dict().items()}
            samples, _ = t.loss_samples(_mixed_groups(t))
            out = t.updater.update(samples)
            assert out.applied and out.tokens > 0
            after = t.model.state_dict()
            results[variant, budget] = {k: after[k] - before[k] for k in after}
    for variant in ("+dynamic_sampling", "grpo"):
        big, small = results[variant, 10_000], results[variant, 8]
        assert any(big[k].abs().sum() > 0 for k in big)  # an update happened
        for k in big:
            # Same sum in another order: equal up to fp32 rounding of the accumulation.
            torch.testing.assert_close(big[k], small[k], rtol=1e-4, atol=3e-7)
    a, b = results["+dynamic_sampling", 10_000], results["grpo", 10_000]
    assert any(not torch.allclose(a[k], b[k]) for k in a)  # the variants really differ


@pytest.mark.slow
def test_non_finite_updates_are_skipped_then_stop(tiny_cfg, tmp_path):
    cfg = resolve(
        tiny_cfg.to_dict(), overrides=["train.max_bad_steps=2", "algo.dynamic_sampling=false"]
    )
    t = _trainer(cfg, tmp_path)
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    # Poison the forward pass: every log-prob becomes NaN.
    original = t.updater.forward

    def poisoned(batch):
        logp, ent, mask = original(batch)
        return logp * float("nan"), ent, mask

    t.updater.forward = poisoned
    mixed = _mixed_groups(t)

    def fake_generate(n, log, step):
        log.acc += [a for g in mixed[:n] for a in g.acc]
        log.lengths += [len(r) for g in mixed[:n] for r in g.response_ids]
        log.finished += [f for g in mixed[:n] for f in g.finished]
        log.parsed += [True for g in mixed[:n] for _ in g.texts]
        return mixed[:n], torch.tensor([g.acc for g in mixed[:n]])

    t.rollouts.generate = fake_generate
    r = t.train_step()
    assert r.metrics["train/skipped_updates"] >= 1
    after = t.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no update applied
    with pytest.raises(TrainingStopped, match="non-finite"):
        t.train_step()


@pytest.mark.slow
def test_checkpoints_are_atomic_and_pruned(tiny_cfg, tmp_path):
    cfg = resolve(tiny_cfg.to_dict(), overrides=["train.keep_checkpoints=2"])
    t = _trainer(cfg, tmp_path)
    for _ in range(3):
        t.train_step()
        save_checkpoint(t, RunDir(tmp_path))
    names = [p.name for p in RunDir(tmp_path).checkpoints()]
    assert names == ["step_000002", "step_000003"]
    # A save killed half-way leaves a tmp dir without COMPLETE: it is never picked up.
    broken = tmp_path / "checkpoints" / ".tmp-step_000004"
    (broken / "model").mkdir(parents=True)
    assert [p.name for p in RunDir(tmp_path).checkpoints()] == names
    meta = json.loads((RunDir(tmp_path).checkpoints()[-1] / "COMPLETE").read_text())
    assert meta["step"] == 3


@pytest.mark.slow
def test_metrics_have_the_documented_names(tiny_cfg, tmp_path):
    t = _trainer(tiny_cfg, tmp_path)
    m = t.train_step().metrics
    required = [
        "train/reward_mean",
        "train/acc_mean",
        "train/entropy",
        "train/response_len_mean",
        "train/truncated_frac",
        "train/clip_frac_low",
        "train/clip_frac_high",
        "train/kept_group_frac",
        "train/num_gen_batches",
        "train/grad_norm",
        "train/lr",
        "perf/step_time_s",
        "perf/tokens_per_s",
        "perf/padding_frac",
    ]
    missing = [k for k in required if k not in m]
    assert not missing
    assert all(math.isfinite(m[k]) for k in required)
    assert m["train/lr"] == pytest.approx(tiny_cfg.train.lr / tiny_cfg.train.warmup_steps)


@pytest.mark.slow
def test_a_run_with_nothing_to_learn_warns_then_stops(tiny_cfg, tmp_path, caplog):
    """Every group all wrong: no gradient. Each such step is warned about, and
    train.max_stalled_steps of them in a row stop the run with the cause and the remedy."""
    cfg = resolve(
        tiny_cfg.to_dict(),
        overrides=["train.max_stalled_steps=2", "algo.dynamic_sampling=false"],
    )
    model, tok = load_policy(resolve_model_path(cfg), "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    never = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train, reward_fn=lambda r, a: False)
    with caplog.at_level("WARNING"):
        m = never.train_step().metrics
        assert m["train/mixed_group_frac"] == 0.0 and never.stall.count == 1
        assert "nothing to learn from" in caplog.text
        with pytest.raises(TrainingStopped, match="2 steps in a row had nothing to learn"):
            never.train_step()


def test_engine_weights_are_synced_before_each_rollout(tiny_cfg, tmp_path):
    """A generator with its own copy of the weights (vLLM) gets the current policy every step."""
    t = _trainer(tiny_cfg, tmp_path)
    synced = []
    t.rollouts.generator.sync_weights = lambda model: synced.append(model is t.model)
    t.train_step()
    t.train_step()
    assert synced == [True, True]


def test_rollout_mismatch_is_measured_and_tis_weights_the_loss(tiny_cfg, tmp_path):
    """On CPU the sampler and the trainer agree (same weights, fp32): the measured gap is float
    noise. Rollout log-probs shifted by log 2 (pi_old / pi_rollout = 2 on every token) show up as
    that ratio and that KL, and TIS with C = 1.5 scales the token-level loss by 1.5 exactly, for
    carried groups too (whose gap is not logged)."""
    one_update = ["algo.dynamic_sampling=false", "train.mini_batch=4"]
    base = resolve(tiny_cfg.to_dict(), overrides=one_update)
    t = _trainer(base, tmp_path / "a")
    groups = _mixed_groups(t)
    assert all(list(map(len, g.logprobs)) == list(map(len, g.response_ids)) for g in groups)
    out = t.updater.update(t.loss_samples(groups)[0])
    assert out.mismatch["abs_diff"] < 1e-4 and 0 <= out.mismatch["kl"] < 1e-6

    for g in groups:
        g.logprobs = [lp - math.log(2) for lp in g.logprobs]

    def loss_with(cap):
        tis = json.dumps({"name": "token_tis", "cap": cap} if cap else {"name": "none"})
        cfg = resolve(tiny_cfg.to_dict(), overrides=[*one_update, f"algo.correction={tis}"])
        t = _trainer(cfg, tmp_path / str(cap))
        return t.updater.update(t.loss_samples(groups)[0])

    plain, tis = loss_with(None), loss_with(1.5)
    assert plain.mismatch["max_ratio"] == pytest.approx(2.0, rel=1e-3)
    assert plain.mismatch["kl"] == pytest.approx(1 - math.log(2), rel=1e-3)
    assert plain.loss != 0 and tis.loss == pytest.approx(1.5 * plain.loss, rel=1e-5)
    # Groups carried from an earlier step: TIS still weights them (they are off-policy), but
    # their gap measures the policy's drift, not the sampler's arithmetic, so it is not logged.
    for g in groups:
        g.step = -1
    carried = loss_with(1.5)
    assert carried.mismatch is None and carried.loss == pytest.approx(tis.loss)


def test_tis_without_sampler_log_probs_stops_with_a_remedy(tiny_cfg, tmp_path):
    cfg = resolve(tiny_cfg.to_dict(), overrides=['algo.correction={"name": "token_tis"}'])
    t = _trainer(cfg, tmp_path)
    groups = _mixed_groups(t)
    for g in groups:
        g.logprobs = None  # a backend that gives none
    with pytest.raises(TrainingStopped, match="algo.correction.name=none"):
        t.loss_samples(groups)


def test_bf16_rollout_weights_track_the_policy_in_place(tiny_cfg, tmp_path):
    """rollout.weights=bfloat16: the sampler holds a bf16 copy, refreshed in place before each
    rollout (same storage, so captured graphs would stay valid) to the policy's weights after its
    update; the per-step mismatch then measures bf16 against fp32 (it is float noise in fp32)."""
    from tasks.rollout.factory import make_generator

    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32")
    assert make_generator(tiny_cfg, model, tok, "").model is model  # auto on CPU: the policy
    cfg = resolve(tiny_cfg.to_dict(), overrides=["rollout.weights=bfloat16"])
    gen = make_generator(cfg, model, tok, "")
    assert gen.model is not model and gen.model.dtype == torch.bfloat16
    ptrs = [p.data_ptr() for p in gen.model.parameters()]
    t = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    out = t.updater.update(t.loss_samples(_mixed_groups(t))[0])  # sampled from the bf16 copy
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())  # it trained
    assert out.mismatch["abs_diff"] > 1e-3  # bf16 sampling against fp32 training
    assert t.sampler() is gen  # what validation samples from: synced to the update
    copy = dict(gen.model.named_parameters())
    assert all(torch.equal(copy[n], p.to(torch.bfloat16)) for n, p in model.named_parameters())
    assert [p.data_ptr() for p in gen.model.parameters()] == ptrs


def test_rollout_copy_only_where_the_policy_is_whole(tiny_cfg, monkeypatch):
    """A bf16 sampling copy needs the policy's full weights: none under ZeRO-3 on several ranks
    (shards only), one under a ZeRO-3 setting on a single process (DeepSpeed is not used)."""
    from tasks.rollout.factory import rollout_dtype

    model, _ = load_policy(resolve_model_path(tiny_cfg), "float32")
    cfg = resolve(tiny_cfg.to_dict(), overrides=["rollout.weights=bfloat16", "train.zero_stage=3"])
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert rollout_dtype(cfg, model) == torch.bfloat16
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert rollout_dtype(cfg, model) is None
    policy = resolve(tiny_cfg.to_dict(), overrides=["rollout.weights=policy"])
    assert rollout_dtype(policy, model) is None


def test_step_mean_old_probability_of_tokens_clipped_above():
    from tasks.training.records import UpdateResult
    from tasks.training.step_metrics import update_metrics

    def update(clipped, prob_sum, tokens=10.0):
        entries = {"clip_high_old_prob": [prob_sum, clipped], "clip_frac_high": [clipped, tokens]}
        return UpdateResult(0.0, tokens, 0.0, entries, grad_norm=1.0)

    # token-weighted over the step: (0.3 + 0.5) / (2 + 1), not the mean of 0.15 and 0.5
    m = update_metrics([update(2, 0.3), update(1, 0.5), update(0, 0.0)], lr=1.0)
    assert m["train/clip_high_old_prob"] == pytest.approx(0.8 / 3)
    # the other entry metrics: the mean of the updates' values, as the loss
    assert m["train/clip_frac_high"] == pytest.approx((0.2 + 0.1 + 0.0) / 3)
    assert "train/clip_high_old_prob" not in update_metrics([update(0, 0.0)], lr=1.0)
    # a metric the entries emit is logged (as 0) by a step whose updates had no token
    none = update_metrics([update(0, 0.0, tokens=0.0)], lr=1.0, names=["clip_frac_low"])
    assert none["train/clip_frac_low"] == 0.0 and none["train/clip_frac_high"] == 0.0


def test_update_sums_weigh_token_means_by_tokens():
    from tasks.training.step_metrics import UpdateSums

    def t(x):
        return torch.tensor(float(x))

    def stats(tokens, entropy, loss, **mismatch):
        return {"tokens": t(tokens), "entropy": t(entropy), "loss": t(loss)} | {
            k: t(v) for k, v in mismatch.items()
        }

    sums = UpdateSums()
    sums.add_micro(stats(10, 1.0, 0.1), {"clip_frac_high": (t(2), t(10))})
    more = dict(mismatch_tokens=6, mismatch_abs_diff=0.6, mismatch_kl=0.3, mismatch_max_ratio=1.5)
    sums.add_micro(stats(30, 2.0, 0.3, **more), {"clip_frac_high": (t(3), t(30))})
    sums.add_micro(stats(1, 9.0, 9.0), {"clip_frac_high": (t(1), t(1))}, real=False)  # padding
    sums.all_reduce(world=1)
    out = sums.result(grad_norm=1.5, applied=False, padding_frac=0.25)
    assert out.entropy == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert out.entries == {"clip_frac_high": [5.0, 40.0]}  # summed apart, divided once
    assert out.loss == pytest.approx(0.4) and out.tokens == 40
    assert out.mismatch["abs_diff"] == pytest.approx(0.1) and out.mismatch["max_ratio"] == 1.5
    assert (out.grad_norm, out.applied, out.padding_frac) == (1.5, False, 0.25)
    empty = UpdateSums().result(0.0, True, 0.0)
    assert empty.entropy == 0.0 and empty.mismatch is None and empty.entries == {}


@pytest.mark.parametrize(
    "variant", ["dapo", "dr_grpo", "gspo", "cispo", "rloo", "reinforce_pp", "grpo_kl", "ppo"]
)
def test_each_algorithm_preset_trains(tiny_cfg, tmp_path, variant):
    """Two steps of each algorithm preset run and move the weights, with finite metrics."""
    from dapo_core.ablation import ALGORITHM_PRESETS

    assert variant in ALGORITHM_PRESETS
    cfg = apply_variant(
        resolve(tiny_cfg.to_dict(), overrides=["algo.dynamic_sampling=false"]), variant
    )
    t = _trainer(cfg, tmp_path)
    t.rollouts.is_correct = lambda response, _: (
        len(response) % 2 == 0
    )  # mixed groups from the start
    before = {k: v.clone() for k, v in t.model.state_dict().items()}
    for _ in range(2):
        m = t.train_step().metrics
        assert math.isfinite(m["train/loss"]) and "train/clip_frac_high" in m
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_pack_samples_places_each_sample_once_within_budget():
    from tasks.training.batches import Sample, fed_tokens, pack_samples

    prompts = [[1, 2, 3], [4, 5], [1, 2, 3]]  # the first and last share a prompt
    samples = [
        Sample(p + [9] * n, len(p), 1.0, True)
        for p, n in zip(prompts * 3, range(1, 10), strict=True)
    ]
    batches = pack_samples(samples, budget=20)
    assert sorted(map(id, (s for b in batches for s in b))) == sorted(map(id, samples))
    for b in batches:
        idx = list(range(len(b)))
        keys = [tuple(s.input_ids[: s.prompt_len]) for s in b]
        lens = [len(s.input_ids) - s.prompt_len for s in b]
        cost = fed_tokens(idx, keys, [s.prompt_len for s in b], lens)
        assert cost <= 20 or len(b) == 1


@pytest.mark.parametrize(
    ("variant", "overrides"),
    [
        ("dapo", ["tracking.switch_probe=clip_higher"]),
        ("ppo", ["algo.kl.name=k1", "algo.kl.where=reward", "algo.correction.name=token_tis"]),
    ],
)
def test_every_metric_a_step_logs_is_catalogued_or_an_entrys(
    tiny_cfg, tmp_path, variant, overrides
):
    """A metric the trainer logs has one name in ``dapo_core.metric_names`` (the readers: the
    ablation, the plots, ``dapo metrics``); the rest are the algorithm entries' own."""
    from dapo_core import metric_names as metric

    cfg = apply_variant(resolve(tiny_cfg.to_dict(), overrides=overrides), variant)
    t = _trainer(cfg, tmp_path)
    t.rollouts.is_correct = lambda response, _: len(response) % 2 == 0  # mixed groups: updates
    logged = set(t.train_step().metrics)
    alg = t.algorithm
    entries = {metric.train(n) for n in alg.metric_names() + alg.batch_metric_names()}
    assert metric.LOSS in logged and entries <= logged  # the step updated; the names are right
    assert logged - entries <= set(metric.CATALOGUE), logged - entries - set(metric.CATALOGUE)


def test_model_compile_none_keeps_the_sampler_eager(tiny_cfg):
    """``model.compile: none`` builds the sampler with the decode step uncompiled and the exact
    sampler (what a short GPU evaluation wants); otherwise the step ``rollout.decode_step``
    names, and each device its own sampler."""
    from tasks.rollout.factory import make_generator
    from tasks.rollout.graphs import DecodeOptions

    model, tok = load_policy(resolve_model_path(tiny_cfg), "float32")
    default = make_generator(tiny_cfg, model, tok, "")
    assert default.decode_options == DecodeOptions() and default.sampler == "auto"
    cfg = resolve(tiny_cfg.to_dict(), overrides=["rollout.decode_step=flex-static"])
    flex = make_generator(cfg, model, tok, "").decode_options
    assert flex == DecodeOptions(attention="flex", dynamic=False)
    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.compile=none"])
    eager = make_generator(cfg, model, tok, "")
    assert eager.decode_options.compiled is False and eager.sampler == "exact"
    with pytest.raises(Exception, match="rollout.decode_step"):
        resolve(tiny_cfg.to_dict(), overrides=["rollout.decode_step=fastest"])
    # the config's choices are the steps the factory knows
    from typing import get_args, get_type_hints

    from dapo_core.config import RolloutConfig
    from tasks.rollout.graphs import DECODE_STEPS

    choices = get_args(get_type_hints(RolloutConfig)["decode_step"])
    assert list(choices) == list(DECODE_STEPS)
