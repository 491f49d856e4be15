"""Data parallelism: the same global batch on 1 rank and on 2 DeepSpeed ranks (CPU, gloo, ZeRO-2
and ZeRO-3) gives the same update, because the loss normalizer is global and shards are rescaled.
The batch spans several micro-batches per rank, so gradient accumulation is exercised too."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dapo_core.ablation import apply_variant
from dapo_core.config_loader import resolve

WORKER = Path(__file__).with_name("ds_worker.py")
ROOT = WORKER.parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, env):
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, _failure(out)
    # DeepSpeed's shared-memory all-reduce is never compiled (tasks.training.distributed)
    assert "shm_comm" not in out.stdout + out.stderr


def _failure(out: subprocess.CompletedProcess) -> str:
    """What a failed launch said: every rank's error lines (torchrun's summary alone would fill
    a tail), then the tails."""
    text = out.stdout + out.stderr
    errors = [x for x in text.splitlines() if any(w in x for w in ("Error", "error", "terminate"))]
    return "\n".join(errors[:60]) + "\n--- tails:\n" + out.stdout[-2000:] + out.stderr[-3000:]


CASES = [
    (2, '{"name": "none"}', None),
    (3, '{"name": "none"}', None),
    # KL in the loss: every rank's own whole reference, one pass over its shard, and the
    # padding micro-batches (ZeRO-3 keeps ranks in step with them) add no KL gradient
    (3, '{"name": "k1", "beta": 0.1}', None),
    # PPO: the critic, a second DeepSpeed engine; its values sharded and gathered, its
    # update accumulated over micro-batches with the global token count
    (2, '{"name": "none"}', "ppo"),
    (3, '{"name": "none"}', "ppo"),
]


def _case_config(tiny_cfg, stage, kl, variant):
    cfg = resolve(
        tiny_cfg.to_dict(),
        # Under ZeRO-3 also truncated importance sampling, whose weights (~1 on CPU) must reach
        # every micro-batch, the empty ones that keep ranks in step included.
        overrides=[
            "train.micro_batch_tokens=16",
            f"train.zero_stage={stage}",
            "algo.correction="
            + ('{"name": "token_tis", "cap": 2}' if stage == 3 else '{"name": "none"}'),
            f"algo.kl={kl}",
        ],
    )
    return apply_variant(cfg, variant) if variant else cfg


@pytest.fixture(scope="module")
def updates(tiny_cfg, tmp_path_factory):
    """Every case's update on 1 rank and on 2: one process, then one 2-rank launch, each running
    all the cases in turn (a launch per case would pay the start-up of three processes each)."""
    tmp = tmp_path_factory.mktemp("ranks")
    args = []
    for i, case in enumerate(CASES):
        params = tmp / f"params{i}.json"
        params.write_text(json.dumps(_case_config(tiny_cfg, *case).to_dict()))
        args.append((params, i))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    for world in ("one", "two"):
        pairs = [str(x) for params, i in args for x in (params, tmp / f"{world}{i}.pt")]
        launch = [sys.executable]
        if world == "two":
            launch += ["-m", "torch.distributed.run", "--nproc_per_node", "2"]
            launch += ["--master_port", str(_free_port())]
        _run([*launch, str(WORKER), *pairs], env)
    return tmp


CASE_IDS = ["zero2", "zero3", "zero3-kl", "zero2-ppo", "zero3-ppo"]


@pytest.mark.slow
def test_two_ranks_equal_one(tiny_cfg, updates, subtests):
    """Every case, each a subtest: one test item, so that the suite's workers never split the
    cases and launch the shared ranks twice."""
    for case, name in enumerate(CASE_IDS):
        with subtests.test(case=name):
            _two_ranks_equal_one(tiny_cfg, updates, case)


def _two_ranks_equal_one(tiny_cfg, updates, case):
    stage, kl, variant = CASES[case]
    cfg = _case_config(tiny_cfg, stage, kl, variant)
    one, two = torch.load(updates / f"one{case}.pt"), torch.load(updates / f"two{case}.pt")
    assert one["world"] == 1 and two["world"] == 2
    assert one["micro_batches"] >= 2 and two["micro_batches"] >= 2  # gradients accumulate
    assert one["stats"]["tokens"] == two["stats"]["tokens"] > 0
    assert two["stats"]["grad_norm"] == pytest.approx(one["stats"]["grad_norm"], rel=1e-5)
    assert one["stats"]["entries"].keys() == two["stats"]["entries"].keys()
    for name, (num, den) in one["stats"]["entries"].items():  # kl_mean among them when on
        assert two["stats"]["entries"][name] == pytest.approx([num, den], rel=1e-5, abs=1e-9)
    kl_num = one["stats"]["entries"].get("kl_mean", [0.0])[0]
    assert (kl_num != 0) == (kl != '{"name": "none"}')  # the perturbed reference differs
    assert two["state"].keys() <= one["state"].keys()  # ZeRO-3 names a tied weight once
    for k, v in two["state"].items():
        torch.testing.assert_close(v, one["state"][k], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(one["before"][k], v) for k, v in one["state"].items())
    # both runs draw the same 5 prompts; on 2 ranks each generated half and all were gathered
    assert two["rollout"]["ids"] == one["rollout"]["ids"] and len(one["rollout"]["ids"]) == 5
    assert two["rollout"]["acc_shape"] == one["rollout"]["acc_shape"] == (5, cfg.rollout.group_size)
    assert one["rollout"]["local_prompts"] == 5 and two["rollout"]["local_prompts"] == 3
    assert bool(one["critic"]) == bool(two["critic"]) == (variant == "ppo")
    # a mini-batch where nothing carries loss: no update on either (it crashed DeepSpeed's step)
    if kl == '{"name": "none"}' and variant is None:  # (PPO's values make advantages)
        assert one["idle"] == two["idle"] == {"grad_norm": 0.0, "applied": True, "moved": False}
    assert one["idle"]["moved"] == two["idle"]["moved"]
    if variant == "ppo":
        _same_critic(one["critic"], two["critic"])


def _same_critic(one, two):
    """The critic's values, returns, advantages and update: the same on 2 ranks as on 1."""
    for key in ("values", "returns", "advantages"):
        for a, b in zip(one[key], two[key], strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    assert any(v.abs().sum() > 0 for v in one["values"])  # the second round reads real values
    assert two["explained_variance"] == pytest.approx(one["explained_variance"], rel=1e-4)
    for a, b in zip(one["stats"], two["stats"], strict=True):
        assert a.keys() == b.keys() and {"value_loss", "value_grad_norm"} <= a.keys()
        for name in a:
            assert b[name] == pytest.approx(a[name], rel=1e-5, abs=1e-9), name
        assert a["value_loss"][1] > 0  # tokens counted
    assert two["state"].keys() <= one["state"].keys()
    for k, v in two["state"].items():
        torch.testing.assert_close(v, one["state"][k], rtol=1e-5, atol=1e-6)


RESUME_CASES = [(2, None), (3, None), (3, "ppo")]


@pytest.fixture(scope="module")
def resumed_runs(tiny_cfg, tmp_path_factory):
    """Every resume case on 2 ranks, in one launch (see resume_worker.py)."""
    tmp = tmp_path_factory.mktemp("resume")
    args = []
    for i, (stage, variant) in enumerate(RESUME_CASES):
        cfg = resolve(
            tiny_cfg.to_dict(),
            overrides=["train.steps=4", f"train.zero_stage={stage}", "train.checkpoint_every=0"],
        )
        cfg = apply_variant(cfg, variant) if variant else cfg
        params = tmp / f"params{i}.json"
        params.write_text(json.dumps(cfg.to_dict()))
        # under ppo a reward the tiny model can earn from step 1: the critic learns
        args += [str(params), str(tmp / f"case{i}"), "1" if variant == "ppo" else "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("WORLD_SIZE", None)
    worker = WORKER.with_name("resume_worker.py")
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    _run([*launch, "--master_port", str(_free_port()), str(worker), *args], env)
    return tmp


@pytest.mark.slow
def test_resumed_multi_rank_run_reproduces_the_uninterrupted_one(resumed_runs, subtests):
    """2 ranks: 4 steps straight, against 2 steps, a stop, and a resume from the checkpoint.
    Under ZeRO-3 the checkpoint's per-rank optimizer state carries the weight partitions (the
    critic's too, under ppo). Each case a subtest of one item (the cases share one launch)."""
    for case, name in enumerate(["zero2", "zero3", "zero3-ppo"]):
        with subtests.test(case=name):
            _resumed_reproduces(resumed_runs, case)


def _resumed_reproduces(resumed_runs, case):
    from safetensors.torch import load_file

    variant = RESUME_CASES[case][1]
    tmp_path = resumed_runs / f"case{case}"

    def history(run):
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [
            {k: v for k, v in json.loads(x).items() if not k.startswith("perf/")} for x in lines
        ]

    full, resumed = history("full"), history("cut")
    assert len(full) == 4 and resumed == full
    weights = ["final/model.safetensors"]
    if variant == "ppo":
        assert all("train/value_loss" in r for r in full)
        assert any(r["train/value_loss"] > 0 for r in full[1:])  # trained after resume too
        weights.append("checkpoints/step_000004/critic/model.safetensors")
    for name in weights:
        wa = load_file(str(tmp_path / "full" / name))
        wb = load_file(str(tmp_path / "cut" / name))
        assert wa.keys() == wb.keys()
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=0)
