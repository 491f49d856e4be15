"""The embedded model directory: tokenizer round trip, loading errors, rollout invariants."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tasks.models.loading import ModelNotFound, chat_prompt, load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator, split_response


def test_tokenizer_round_trip_through_from_pretrained(tiny_cfg, tmp_path):
    from transformers import AutoTokenizer

    path = resolve_model_path(tiny_cfg)
    tok = AutoTokenizer.from_pretrained(path)
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "Compute 12 + 7.\nAnswer:  19 with  two spaces\tand a tab"
    assert tok(text)["input_ids"] == again(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text  # spaces survive (byte-level vocab)
    assert chat_prompt(tok, "hi") == chat_prompt(again, "hi")
    assert chat_prompt(tok, "hi").endswith("assistant\n")


@pytest.mark.parametrize("loader", ["policy", "reward model"])
def test_missing_model_path_is_a_clear_error(tmp_path, loader):
    """The same one line whether the policy or a reward model is loaded (the reward model's
    loader went on to transformers and gave its long message)."""
    from tasks.models.learned_reward import load_reward_model

    load = load_policy if loader == "policy" else (lambda p: load_reward_model(p, "cpu"))
    with pytest.raises(ModelNotFound, match="no such model directory"):
        load(str(tmp_path / "nope"))
    with pytest.raises(ModelNotFound, match="no such model directory"):
        load("runs/no-such-run/final")  # relative, deeper than a hub id's owner/name
    with pytest.raises(ModelNotFound, match="no config.json; pass a Hugging Face model dir"):
        load(str(tmp_path))  # a directory, but not a model
    (tmp_path / "weights.safetensors").write_bytes(b"")
    with pytest.raises(ModelNotFound, match="no config.json"):
        load(str(tmp_path / "weights.safetensors"))  # a file


@pytest.fixture
def hub_out_of_reach(monkeypatch, tmp_path):
    """The hub at a port nothing listens on, an empty cache, not in offline mode; a load that
    gets as far as transformers fails the test."""
    import huggingface_hub.constants as hub
    import transformers

    monkeypatch.setattr(hub, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)

    def reached(*args, **kwargs):
        raise AssertionError("transformers was asked to load a hub id out of reach")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", reached)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", reached)
    return tmp_path / "hub-cache"


def test_a_hub_id_out_of_reach_is_refused_at_once_in_one_line(hub_out_of_reach):
    """huggingface_hub retried for most of a minute, a warning a try, before failing."""
    from tasks.models.learned_reward import load_reward_model

    for load in (load_policy, lambda p: load_reward_model(p, "cpu")):
        with pytest.raises(ModelNotFound) as e:
            load("some-owner/some-model")
        said = str(e.value)
        assert said.startswith("could not reach http://127.0.0.1:9 to download 'some-owner/some")
        assert said.endswith("offline, use a local model directory or -S model.name_or_path=tiny")
        assert "\n" not in said


def test_a_cached_hub_id_is_loaded_without_asking_the_hub(hub_out_of_reach):
    """Its files are in the cache: the load goes on (to transformers, here the fixture's
    failure), with no probe of the hub to wait for."""
    snapshot = hub_out_of_reach / "models--some-owner--some-model" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    refs = hub_out_of_reach / "models--some-owner--some-model" / "refs"
    refs.mkdir()
    (refs / "main").write_text("abc")
    with pytest.raises(AssertionError, match="transformers was asked"):
        load_policy("some-owner/some-model")


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ("model.safetensors", "invalid header length"),  # a copy cut short
        ("config.json", "not a valid JSON file"),
    ],
)
def test_a_damaged_model_directory_is_one_line_saying_what_to_do(tiny_cfg, tmp_path, damage, said):
    """Not a traceback from safetensors, and not the offline advice meant for a hub id; the
    reward model's loader says the same."""
    import shutil

    from tasks.models.learned_reward import load_reward_model

    model = tmp_path / "m"
    shutil.copytree(resolve_model_path(tiny_cfg), model)
    whole = (model / damage).read_bytes()
    (model / damage).write_bytes(whole[: len(whole) // 100])
    for load in (load_policy, lambda p: load_reward_model(p, "cpu")):
        with pytest.raises(ModelNotFound, match=said) as e:
            load(str(model))
        assert "truncated or corrupt; copy, fetch or build it again" in str(e.value)


def test_a_model_directory_without_its_tokenizer_or_a_run_directory_is_one_line(tiny_cfg, tmp_path):
    """Without tokenizer files a model loaded and sampling failed with a traceback; a run's
    directory had its run config read as a model's."""
    import shutil

    from tasks.models.learned_reward import load_reward_model

    model = tmp_path / "m"
    shutil.copytree(resolve_model_path(tiny_cfg), model)
    for f in model.glob("tokenizer*"):
        f.unlink()
    run = tmp_path / "run"
    shutil.copytree(resolve_model_path(tiny_cfg), run / "final")
    (run / "config.json").write_text(json.dumps(tiny_cfg.to_dict()))
    for load in (load_policy, lambda p: load_reward_model(p, "cpu")):
        with pytest.raises(ModelNotFound, match="has no tokenizer .*copy, fetch or build it"):
            load(str(model))
        with pytest.raises(ModelNotFound) as e:
            load(str(run))
        assert str(e.value) == f"{run} is a training run's directory; its policy is in {run}/final"


def test_a_model_this_transformers_does_not_know_is_not_called_corrupt(tiny_cfg, tmp_path):
    import json
    import shutil

    model = tmp_path / "m"
    shutil.copytree(resolve_model_path(tiny_cfg), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(config | {"model_type": "no-such-arch"}))
    with pytest.raises(ModelNotFound, match="cannot be loaded by transformers") as e:
        load_policy(str(model))
    assert "no-such-arch" in str(e.value) and "corrupt" not in str(e.value)


def test_split_response():
    assert split_response([5, 6, 2, 0, 0], {2}, 0) == ([5, 6, 2], True)
    assert split_response([5, 6, 7], {2}, 0) == ([5, 6, 7], False)


def test_generator_shapes_and_truncation(tiny_cfg):
    model, tok = load_policy(resolve_model_path(tiny_cfg))
    gen = HFGenerator(model, tok, max_prompt_len=8)
    torch.manual_seed(0)
    prompts = [chat_prompt(tok, "Compute 1 + 2."), chat_prompt(tok, "Compute 3 + 4.")]
    out = gen.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_new_tokens=5)
    assert len(out.response_ids) == 6 and len(out.texts) == 6
    assert out.prompts_truncated == 2 and all(len(p) == 8 for p in out.prompt_ids)
    for ids, fin in zip(out.response_ids, out.finished, strict=True):
        assert 1 <= len(ids) <= 5
        assert fin == (ids[-1] == tok.eos_token_id)


@pytest.fixture(scope="module")
def llama_path(tiny_cfg, tmp_path_factory):
    """A random tiny Llama (the architecture of SmolLM2) with the embedded model's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(resolve_model_path(tiny_cfg))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _policy_path(arch, tiny_cfg, request):
    return (
        resolve_model_path(tiny_cfg) if arch == "qwen2" else request.getfixturevalue("llama_path")
    )


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize(
    "decode",
    ["lean-fused", "lean-unfused", "static", "transformers"],
    ids=lambda d: f"{d}-decode",
)
def test_sampling_logprobs_equal_the_trainers_forward(
    tiny_cfg, tmp_path, decode, monkeypatch, arch, request
):
    """On-policy: the rollout's log-probs (prompt prefilled once, KV cache shared by the G samples,
    left padding) equal what the trainer computes for the same tokens (right padding), with the
    lean decode step (fused projections as on CPU, or separate as on GPU) and with the generic
    transformers forward."""
    from dapo_core.config_loader import resolve
    from tasks.data.splits import splits
    from tasks.rollout.decode import LeanDecoder
    from tasks.rollout.graphs import StaticDecoder
    from tasks.training.trainer import DAPOTrainer, Sample

    lean = decode != "transformers"
    if decode == "lean-unfused":
        monkeypatch.setattr(LeanDecoder, "FUSED_DEVICES", ())
    monkeypatch.setattr(StaticDecoder, "WINDOW", 4)  # attention's window grows mid-rollout
    cfg = resolve(tiny_cfg.to_dict(), overrides=["rollout.temperature=0.7"])
    model, tok = load_policy(_policy_path(arch, cfg, request))
    assert LeanDecoder.supports(model)  # Qwen2 and Llama take the lean path when asked
    # static: the CUDA-graph decoder's fixed-shape step, run eagerly (no graphs on CPU)
    gen = HFGenerator(model, tok, max_prompt_len=64, lean=lean, graphs=decode == "static")
    trainer = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    torch.manual_seed(0)
    short, long = chat_prompt(tok, "Compute 1 + 2."), chat_prompt(tok, "Compute 10 + 20 + 3 + 4.")
    for prompts in ([short, long], [long]):  # left padding, and none
        out = gen.generate(prompts, n=3, temperature=0.7, top_p=0.9, max_new_tokens=6)
        for i, (resp, lps) in enumerate(zip(out.response_ids, out.logprobs, strict=True)):
            prompt = out.prompt_ids[i // 3]
            with torch.no_grad():
                sample = Sample(prompt + resp, len(prompt), 1.0, True)
                logp, _, _ = trainer.updater.forward([sample])
            found = logp[0, : len(resp)]  # the forward pads a one-token response to two
            torch.testing.assert_close(found, torch.tensor(lps), rtol=1e-4, atol=1e-4)


def test_sample_next_follows_the_nucleus_distribution():
    """Inverse-CDF sampling: frequencies match softmax(logits / T) restricted to the top-p nucleus
    and renormalised; tokens outside the nucleus or at -inf are never drawn."""
    from tasks.rollout.sampling import sample_next

    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, float("-inf"), -1.0])
    probs = torch.softmax(logits / 0.8, dim=-1)
    for top_p, keep in ((1.0, [0, 1, 2, 3, 5]), (0.9, [0, 1, 2]), (0.5, [0])):
        nucleus = torch.zeros_like(probs)
        nucleus[keep] = probs[keep]
        expected = nucleus / nucleus.sum()
        tokens, logp = sample_next(logits.expand(40_000, -1), 0.8, top_p)
        freq = torch.bincount(tokens, minlength=6).float() / len(tokens)
        assert set(tokens.unique().tolist()) == set(keep)
        torch.testing.assert_close(freq, expected, atol=0.01, rtol=0)
        # The log-probs are those of the unrestricted tempered distribution (what the loss uses).
        torch.testing.assert_close(logp, probs.log()[tokens])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["shared-prompt", "checkpointed"])
def test_shared_prompt_forward_equals_whole_sequences(
    tiny_cfg, tmp_path, checkpointing, arch, request
):
    """The trainer runs each distinct prompt once and lets its samples attend to the shared keys
    and values; log-probs and gradients equal those of every sample run whole on its own. Under
    gradient checkpointing (no KV cache in transformers) it runs whole sequences: same values."""
    from tasks.data.splits import splits
    from tasks.training.trainer import DAPOTrainer, Sample

    model, tok = load_policy(_policy_path(arch, tiny_cfg, request), "float32")
    if checkpointing:
        model.activation_checkpointing_enable()
    trainer = DAPOTrainer(tiny_cfg, model, tok, None, splits(tiny_cfg).train)
    T = tiny_cfg.rollout.temperature
    short = tok(chat_prompt(tok, "Compute 1 + 2."))["input_ids"]
    long = tok(chat_prompt(tok, "Compute 10 + 20 + 3 + 4."))["input_ids"]
    batch = [
        Sample(short + [40, 41, 42], len(short), 1.0, True),
        Sample(long + [50], len(long), -1.0, True),
        Sample(short + [43], len(short), -1.0, True),
        Sample(long + [51, 52, 53, 54, 55], len(long), 1.0, True),
    ]
    logp, _, mask = trainer.updater.forward(batch)
    (logp * mask).sum().backward()
    shared_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    total = 0.0
    for i, s in enumerate(batch):
        ids = torch.tensor([s.input_ids])
        logits = model(input_ids=ids).logits[0, s.prompt_len - 1 : -1].float() / T
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, s.prompt_len :, None])[:, 0]
        torch.testing.assert_close(logp[i, : len(ref)], ref, rtol=1e-5, atol=1e-5)
        assert mask[i].sum() == len(ref)
        total = total + ref.sum()
    total.backward()
    for shared, p in zip(shared_grads, model.parameters(), strict=True):
        torch.testing.assert_close(shared, p.grad, rtol=1e-4, atol=1e-5)
    # One-token responses only: predicted from the prompts alone, though the response pass still
    # runs (on a masked column): under ZeRO-3 every micro-batch, the padding one included, must
    # make the same decoder calls on every rank, or the ranks' parameter gathers fall out of step.
    calls = []
    hook = model.get_decoder().register_forward_hook(lambda *_: calls.append(1))
    one, _, one_mask = trainer.updater.forward([batch[2], batch[1]])
    torch.testing.assert_close(one[:, 0], torch.stack([logp[2, 0], logp[1, 0]]))
    assert one_mask[:, 1:].sum() == 0  # the extra column counts for nothing
    per_batch = [len(calls)]
    for b in (batch, trainer.updater.dummy()):
        calls.clear()
        trainer.updater.forward(b)
        per_batch.append(len(calls))
    hook.remove()
    assert per_batch == [1, 1, 1] if checkpointing else per_batch == [2, 2, 2]


def test_warm_start_sees_only_the_training_split(tiny_cfg, tmp_path, monkeypatch):
    """The embedded model learns no validation or test problem before it is scored on them: its
    tokenizer corpus and warm-start list are ``splits(cfg).train``, and every warm-start batch
    draws from that list only."""
    import tasks.models.tiny as tiny
    import tasks.models.warm_start as warm
    from dapo_core.config_loader import resolve
    from tasks.data.splits import splits

    cfg = resolve(
        tiny_cfg.to_dict(), overrides=[f"tiny.path={tmp_path / 'model'}", "tiny.warm_start_steps=4"]
    )
    corpus, lists, batches = [], [], []
    build, start, batch = tiny.build_tiny_model, warm.warm_start, warm.sft_batch

    def record_build(tiny, train, out_dir, seed):
        corpus.append(list(train))
        return build(tiny, train, out_dir, seed)

    def record_start(model_dir, train, *args):
        lists.append(list(train))
        return start(model_dir, train, *args)

    def record_batch(tokenizer, problems):
        batches.append(list(problems))
        return batch(tokenizer, problems)

    monkeypatch.setattr(tiny, "build_tiny_model", record_build)
    monkeypatch.setattr(warm, "warm_start", record_start)
    monkeypatch.setattr(warm, "sft_batch", record_batch)
    assert resolve_model_path(cfg) == str(tmp_path / "model")

    parts = splits(cfg)
    train = {p.id for p in parts.train}
    held_out = {p.id for p in parts.val} | {p.id for p in parts.test}
    assert len(parts.val) == cfg.data.val_size and parts.test  # there is something to leak
    assert corpus == [parts.train] and lists == [parts.train]
    assert len(batches) == cfg.tiny.warm_start_steps
    drawn = {p.id for b in batches for p in b}
    assert drawn <= train and not drawn & held_out


def test_embedded_model_is_rebuilt_when_what_it_was_built_from_changes(tiny_cfg, tmp_path):
    """A model directory built for another task or split is stale, not silently reused."""
    from dapo_core.config_loader import resolve
    from tasks.models.build import BUILD_RECORD

    cfg = resolve(
        tiny_cfg.to_dict(), overrides=[f"tiny.path={tmp_path}", "tiny.warm_start_steps=1"]
    )
    path = Path(resolve_model_path(cfg))
    built = (path / BUILD_RECORD).stat().st_mtime_ns
    assert resolve_model_path(cfg) == str(path)
    assert (path / BUILD_RECORD).stat().st_mtime_ns == built  # same spec: reused
    other = resolve(cfg.to_dict(), overrides=["synthetic.num_train=50"])
    assert resolve_model_path(other) == str(path)
    assert (path / BUILD_RECORD).stat().st_mtime_ns != built  # another task: rebuilt


def test_an_embedded_model_without_a_warm_start_builds_under_a_target(tiny_cfg, tmp_path):
    """tiny.warm_start_steps=0 with a validation target: the untrained model, not an IndexError
    from a warning about a check that never ran."""
    from dapo_core.config_loader import resolve
    from tasks.models.build import BUILD_RECORD

    overrides = [f"tiny.path={tmp_path}", "tiny.warm_start_steps=0", "tiny.warm_start_target=0.5"]
    path = Path(resolve_model_path(resolve(tiny_cfg.to_dict(), overrides=overrides)))
    record = json.loads((path / BUILD_RECORD).read_text())
    assert record["build"]["warm_start"] == {"steps": 0}  # untrained, never checked


def test_format_warm_start_of_a_pretrained_model(tiny_cfg, llama_path, tmp_path):
    """Any model gets a supervised format warm start into its own directory, built once and
    rebuilt when what it was built from changes; the base model is left as it was."""
    from dapo_core.config_loader import resolve
    from tasks.models.build import BUILD_RECORD
    from tasks.models.warm_start import ensure_warm_started

    cfg = resolve(tiny_cfg.to_dict(), overrides=["model.warm_start_steps=2"])
    before = (Path(llama_path) / "model.safetensors").read_bytes()
    out = ensure_warm_started(cfg, llama_path, root=tmp_path)
    assert out == tmp_path / f"{Path(llama_path).name}-warm"
    assert (out / "config.json").exists() and (out / BUILD_RECORD).exists()
    assert (out / "model.safetensors").read_bytes() != before  # trained
    assert (Path(llama_path) / "model.safetensors").read_bytes() == before  # base untouched
    built = (out / BUILD_RECORD).stat().st_mtime_ns
    assert ensure_warm_started(cfg, llama_path, root=tmp_path) == out
    assert (out / BUILD_RECORD).stat().st_mtime_ns == built  # reused
    more = resolve(cfg.to_dict(), overrides=["model.warm_start_steps=3"])
    ensure_warm_started(more, llama_path, root=tmp_path)
    assert (out / BUILD_RECORD).stat().st_mtime_ns != built  # rebuilt


@pytest.mark.parametrize("check_every", [1, 5])
def test_dropping_finished_sequences_changes_no_sample(tiny_cfg, monkeypatch, check_every):
    """Compaction (finished sequences leave the lean decoder's batch once half have finished)
    gives the same rollouts as decoding the whole batch to the end: same tokens, same flags, the
    same log-probs, and it did drop rows; so does checking for finished rows only every few
    tokens (as on a GPU), against every token."""
    from tasks.data.splits import splits
    from tasks.rollout.decode import LeanDecoder

    model, tok = load_policy(resolve_model_path(tiny_cfg))
    prompts = [chat_prompt(tok, p.prompt) for p in splits(tiny_cfg).train[:6]]
    monkeypatch.setattr(HFGenerator, "COMPACT_AT", 0.25)  # this model finishes ~40% by 24
    monkeypatch.setattr(HFGenerator, "CHECK_EVERY", {"cpu": check_every})
    kept: list[int] = []
    keep = LeanDecoder.keep
    monkeypatch.setattr(
        LeanDecoder, "keep", lambda self, rows: (kept.append(len(rows)), keep(self, rows))[1]
    )
    outs = {}
    for compact in (True, False):
        torch.manual_seed(0)
        gen = HFGenerator(model, tok, max_prompt_len=64, compact=compact)
        outs[compact] = gen.generate(prompts, n=4, temperature=1.0, top_p=1.0, max_new_tokens=24)
        monkeypatch.setattr(HFGenerator, "CHECK_EVERY", {})  # the reference checks every token
    assert kept and all(0 < k < 24 for k in kept)  # rows were dropped, never all of them
    a, b = outs[True], outs[False]
    assert a.response_ids == b.response_ids and a.finished == b.finished
    assert len(set(map(len, a.response_ids))) > 1  # lengths differ: there was something to drop
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_fixed_shape_decoder_gives_the_lean_decoders_rollouts(tiny_cfg, monkeypatch):
    """The CUDA-graph decoder's step (buffers for the longest rollout, a device-side write
    position, attention over a window grown in steps, the batch padded to a power of two and
    compacted), run eagerly on CPU, samples what the lean decoder samples from the same seed:
    the same tokens and flags, the same log-probs. Its buffers are kept across calls with
    different prompt widths and batch sizes, and rebuilt, no smaller than before, when a call
    needs longer rollouts."""
    from tasks.data.splits import splits
    from tasks.rollout.graphs import DecodeOptions, StaticDecoder

    model, tok = load_policy(resolve_model_path(tiny_cfg))
    prompts = [chat_prompt(tok, p.prompt) for p in splits(tiny_cfg).train[:5]]
    monkeypatch.setattr(HFGenerator, "COMPACT_AT", 0.25)
    monkeypatch.setattr(StaticDecoder, "WINDOW", 8)
    kept: list[int] = []
    keep = StaticDecoder.keep
    monkeypatch.setattr(
        StaticDecoder, "keep", lambda self, rows: (kept.append(len(rows)), keep(self, rows))[1]
    )
    lean = HFGenerator(model, tok, max_prompt_len=64, graphs=False)
    static = HFGenerator(model, tok, max_prompt_len=64, graphs=True, draw_in_graphs=False)
    # The sampler recorded with the step (CUDA's way), run eagerly: the same draws.
    drawing = HFGenerator(model, tok, max_prompt_len=64, graphs=True, draw_in_graphs=True)
    # FlexAttention's step: one window, the whole buffer (its eager maths here: no block skipped)
    flex = HFGenerator(
        model, tok, max_prompt_len=64, graphs=True, decode_options=DecodeOptions(attention="flex")
    )
    decoders = []
    for batch, n, new in ((prompts, 4, 24), (prompts[3:], 2, 24), (prompts[:2], 3, 40)):
        outs = []
        for gen in (lean, static, drawing, flex):
            torch.manual_seed(0)
            outs.append(gen.generate(batch, n, temperature=1.0, top_p=0.9, max_new_tokens=new))
        a = outs[0]
        for b in outs[1:]:
            assert a.response_ids == b.response_ids and a.finished == b.finished
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=1e-5, atol=1e-5)
        decoders.append(static._static)
    assert kept  # compaction ran on the fixed-shape buffers
    assert decoders[0] is decoders[1]  # a narrower batch reuses the buffers
    assert decoders[2] is not decoders[1]  # 40 new tokens outgrow them: rebuilt
    assert decoders[0].rows == 32 and decoders[0].capacity == 64 + 24  # 20 rows -> 32
    assert decoders[2].rows == 32  # rebuilt large enough for the earlier calls too
    long = StaticDecoder(model, 4, 100 * StaticDecoder.WINDOW, capture=False)
    assert long.window == 4 * StaticDecoder.WINDOW  # 100 windows of 8 would exceed MAX_WINDOWS
    assert long.capacity // long.window <= StaticDecoder.MAX_WINDOWS


def test_drawing_inside_the_graphs_keeps_min_new_tokens_and_each_sampler(tiny_cfg, monkeypatch):
    """The recorded draw (run eagerly on CPU) against the step-by-step loop, for the blocked
    sampler (CUDA's) and with EOS suppressed for the first 12 tokens: the same rollouts, none
    shorter than 12 tokens, and a second call through the kept decoder draws afresh."""
    from tasks.data.splits import splits
    from tasks.rollout.graphs import StaticDecoder

    model, tok = load_policy(resolve_model_path(tiny_cfg))
    prompts = [chat_prompt(tok, p.prompt) for p in splits(tiny_cfg).train[:3]]
    monkeypatch.setattr(StaticDecoder, "WINDOW", 8)
    kwargs = dict(max_prompt_len=64, graphs=True, sampler="blocked", min_new_tokens=12)
    outs = []
    for in_graphs in (False, True, True):
        gen = HFGenerator(model, tok, draw_in_graphs=in_graphs, **kwargs)
        torch.manual_seed(1)
        outs.append(gen.generate(prompts, 3, temperature=1.0, top_p=1.0, max_new_tokens=20))
    steps, drawn, again = outs
    assert steps.response_ids == drawn.response_ids == again.response_ids
    assert min(steps.lengths) >= 12
    torch.manual_seed(2)
    other = gen.generate(prompts, 3, temperature=1.0, top_p=1.0, max_new_tokens=20)
    assert other.response_ids != drawn.response_ids
    # One generator of each kind kept across calls with other settings, in chunks of 6 sequences
    # that finish early: each call draws what the step-by-step loop draws, and leaves the
    # random stream where it leaves it (the next chunk, the next call, depend on that).
    pair = [
        HFGenerator(model, tok, max_prompt_len=64, graphs=True, batch_size=6, draw_in_graphs=g)
        for g in (False, True)
    ]
    samplers = ((1.0, 1.0, "blocked"), (0.7, 0.9, "blocked"), (0.7, 0.9, "exact"))
    for temperature, top_p, sampler in samplers:
        outs, after = [], []
        for gen in pair:
            gen.sampler = sampler
            torch.manual_seed(3)
            outs.append(gen.generate(prompts, 3, temperature, top_p, max_new_tokens=40))
            after.append(torch.rand(1).item())
        assert outs[0].response_ids == outs[1].response_ids and after[0] == after[1]
        assert not all(outs[0].finished) or max(outs[0].lengths) < 40  # some ended early


def test_a_saved_tokenizer_does_not_carry_its_load_options(tiny_cfg, tmp_path):
    """transformers writes a tokenizer's load options back when it saves it, and
    ``local_files_only`` follows HF_HUB_OFFLINE: a saved model directory, and its digest, would
    depend on the saving process's environment. Loaded either way, it saves the same file."""
    import json

    from tasks.models.loading import load_tokenizer

    path = resolve_model_path(tiny_cfg)
    saved = []
    for offline in (True, False):
        out = tmp_path / str(offline)
        load_tokenizer(path, local_files_only=offline).save_pretrained(out)
        saved.append((out / "tokenizer_config.json").read_text())
    assert "local_files_only" not in json.loads(saved[0]) and saved[0] == saved[1]


def test_compiled_fixed_shape_step_gives_the_lean_decoders_rollouts(tiny_cfg, monkeypatch, request):
    """The CUDA default step (fused projections, SDPA, the regions around attention compiled),
    traced by torch.compile here on CPU and run eagerly: the lean decoder's tokens, and its
    log-probs within float32 rounding. The regions go through Dynamo and AOTAutograd as on a GPU
    (where a call that does not trace, or a wrong signature, would fail) but not through
    Inductor's code generation: on CPU it would generate C++ that no GPU runs, at ~20 s."""
    from tasks.data.splits import splits
    from tasks.rollout import regions
    from tasks.rollout.graphs import DecodeOptions

    monkeypatch.setattr(regions, "COMPILE_BACKEND", "aot_eager")
    regions.compiled.cache_clear()
    request.addfinalizer(regions.compiled.cache_clear)  # no later test gets these regions

    model, tok = load_policy(resolve_model_path(tiny_cfg))
    prompts = [chat_prompt(tok, p.prompt) for p in splits(tiny_cfg).train[:2]]
    outs = []
    for options in (None, DecodeOptions(compiled=True)):
        gen = HFGenerator(
            model, tok, max_prompt_len=64, graphs=options is not None, decode_options=options
        )
        torch.manual_seed(0)
        outs.append(gen.generate(prompts, 2, temperature=1.0, top_p=1.0, max_new_tokens=8))
    a, b = outs
    assert a.response_ids == b.response_ids
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), rtol=1e-5, atol=1e-5)


def test_flex_attention_skips_only_blocks_past_the_newest_token(monkeypatch):
    """FlexAttention compiled (Inductor's CPU kernel: the eager maths ignores the block count)
    with the block count the step sets, the newest token just before, at and past a block's
    start: the attention of each row over positions 0 to the newest, padding masked, as the
    six-kernel maths computes it; and a count one short would have dropped the newest block."""
    from tasks.rollout import flex
    from tasks.rollout.decode import attend

    monkeypatch.setattr(flex, "FLEX_BLOCK", 16)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    B, kv, group, T, d = 3, 2, 3, 64, 8
    q = torch.randn(B, kv, group, d, generator=g)
    keys, values = torch.randn(2, B, kv, T, d, generator=g)
    mask = flex.block_mask(group, T, "cpu")
    compiled = torch.compile(flex.attend, dynamic=False)
    for newest in (15, 16, 17, 40):
        bias = torch.full((B, 1, 1, T), float("-inf"))
        bias[..., : newest + 1] = 0.0
        bias[0, ..., :3] = float("-inf")  # left padding
        expected = attend(q, keys, values, bias, 0.3)
        mask.kv_num_blocks.copy_(flex.blocks_to_visit(torch.tensor([newest])))
        torch.testing.assert_close(compiled(q, keys, values, bias, 0.3, mask), expected)
        mask.kv_num_blocks -= 1
        assert not torch.allclose(compiled(q, keys, values, bias, 0.3, mask), expected)


def test_a_function_compiled_with_fixed_sizes_compiles_for_every_batch_size(monkeypatch):
    """Twelve batch sizes (512 compacted down to 1, and more), each its own compilation: none
    runs uncompiled past torch's default limit of eight."""
    from torch._dynamo.testing import CompileCounter

    from tasks.rollout import regions

    counter = CompileCounter()
    monkeypatch.setattr(regions, "COMPILE_BACKEND", counter)
    regions.compiled.cache_clear()

    def double(x):
        return x * 2

    # torch's own patch puts the limit back (pytest's monkeypatch would leave the setting hidden)
    with torch._dynamo.config.patch(recompile_limit=8):
        fn = regions.compiled(double, False)
        try:
            for rows in range(1, 13):
                assert torch.equal(fn(torch.ones(rows, 3)), torch.full((rows, 3), 2.0))
        finally:
            regions.compiled.cache_clear()
    assert counter.frame_count == 12


def test_autotune_asks_inductor_alone_for_max_autotune_by_timing(monkeypatch):
    """``autotune``: Inductor's max-autotune, without its own CUDA graphs (the decoder records
    its own) and by timing even under ``TORCHINDUCTOR_DETERMINISTIC`` (by rule it would keep
    cuBLAS); settings Inductor knows. Another backend (the CPU tests' ``aot_eager``, which has
    no such settings) compiles as without it."""
    from tasks.rollout import regions

    options = regions.autotune_options()
    assert options["max_autotune"] and options["deterministic"] is False
    assert not options.get("triton.cudagraphs")
    # quietly: no tables of candidates, no stats lines, no errors for oversized candidates
    assert options["autotune_num_choices_displayed"] == 0
    assert options["max_autotune_report_choices_stats"] is False
    assert options["max_autotune_prune_choices_based_on_shared_mem"] is True
    with torch._inductor.config.patch(options):  # raises on a setting Inductor does not have
        assert torch._inductor.config.max_autotune and not torch._inductor.config.deterministic
    asked = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: asked.append(kw) or fn)
    regions.compiled.cache_clear()
    try:
        regions.compiled(abs, True, True)
        regions.compiled(abs, True, False)
        monkeypatch.setattr(regions, "COMPILE_BACKEND", "aot_eager")
        regions.compiled(round, True, True)
    finally:
        regions.compiled.cache_clear()
    assert [(kw["backend"], kw["options"]) for kw in asked] == [
        ("inductor", options),
        ("inductor", None),
        ("aot_eager", None),
    ]


def test_autotune_leaves_out_quieting_settings_this_torch_lacks(monkeypatch):
    """A torch version without one of the quieting settings still compiles: torch.compile
    refuses an option Inductor does not have, so that one is left out."""
    from tasks.rollout import regions

    monkeypatch.setitem(regions.QUIET_AUTOTUNE, "a_setting_no_torch_has", 1)
    options = regions.autotune_options()
    assert "a_setting_no_torch_has" not in options
    assert options["autotune_num_choices_displayed"] == 0


def test_the_autotuned_step_compiles_regions_and_attention_with_fixed_sizes_and_autotune(
    tiny_cfg, monkeypatch
):
    """``rollout.decode_step: flex-static-autotune`` reaches what is compiled: both regions and
    FlexAttention with fixed sizes and max-autotune, and the step gives the uncompiled step's
    logits."""
    from bench.decode import loaded_decoder
    from tasks.rollout import flex, regions
    from tasks.rollout.graphs import DECODE_STEPS, DecodeOptions

    asked = {}

    def compiled(fn, dynamic, autotune=False):
        asked[fn.__name__] = (dynamic, autotune)
        return fn

    monkeypatch.setattr(regions, "compiled", compiled)
    model, _ = load_policy(resolve_model_path(tiny_cfg))
    steps = (
        DecodeOptions(compiled=False),
        replace(DECODE_STEPS["flex-static-autotune"], compiled=True),
    )
    logits = []
    for options in steps:
        torch.manual_seed(0)
        dec = loaded_decoder(model, 4, 12, 4, options, capture=False)
        with torch.no_grad():
            logits.append(dec.step(torch.arange(4), torch.full((4, 1), 12)))
    assert asked == {
        "attention_inputs": (False, True),
        "after_attention": (False, True),
        flex.attend.__name__: (False, True),
    }
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)


def test_flex_step_under_its_skipping_kernel_gives_the_default_steps_logits(tiny_cfg, monkeypatch):
    """The decoder's FlexAttention wiring (one window, the block count set before each step)
    under the compiled kernel that skips blocks (Inductor's CPU code; the regions around it
    traced cheaply): at every step across two block starts, the logits of the SDPA step. A block
    count one short would drop the newest token's block at each block start."""
    from bench.decode import loaded_decoder
    from tasks.rollout import flex, regions
    from tasks.rollout.graphs import DecodeOptions

    monkeypatch.setattr(flex, "FLEX_BLOCK", 16)

    def compiled(fn, dynamic, autotune=False):
        backend = "inductor" if fn is flex.attend else "aot_eager"
        return torch.compile(fn, dynamic=dynamic, backend=backend)

    monkeypatch.setattr(regions, "compiled", compiled)
    torch._dynamo.reset()
    model, _ = load_policy(resolve_model_path(tiny_cfg))
    options = (DecodeOptions(compiled=False), DecodeOptions(attention="flex", compiled=True))
    decoders = []
    for o in options:  # the same random prompt cache (12 positions, left padding) in both
        torch.manual_seed(0)
        decoders.append(loaded_decoder(model, 4, 12, 30, o, capture=False))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in range(12, 40):
            tokens = torch.randint(model.config.vocab_size, (4,), generator=g)
            pos = torch.full((4, 1), t)
            sdpa, flexed = (dec.step(tokens, pos) for dec in decoders)
            torch.testing.assert_close(flexed, sdpa, rtol=1e-4, atol=1e-4)
    assert decoders[1].block_mask.kv_num_blocks.item() == 39 // 16 + 1


def test_saving_a_model_does_not_import_deepspeed(tiny_cfg, tmp_path):
    """save_pretrained asked accelerate whether the model is a DeepSpeedEngine, and accelerate
    imported DeepSpeed to answer (seconds per process that saves); unless it is imported
    already, the answer is no. The saved directory is what save_pretrained writes."""
    import subprocess
    import sys

    script = (
        "import sys; from pathlib import Path\n"
        "from tasks.models.loading import load_policy, load_tokenizer, save_model_dir\n"
        "import accelerate.utils.other as other\n"
        "asked = other.is_deepspeed_available\n"
        f"m, tok = load_policy({str(resolve_model_path(tiny_cfg))!r})\n"
        f"save_model_dir(m, tok, Path({str(tmp_path / 'ours')!r}))\n"
        "assert 'deepspeed' not in sys.modules and other.is_deepspeed_available is asked\n"
        f"m.save_pretrained({str(tmp_path / 'theirs')!r}); tok.save_pretrained("
        f"{str(tmp_path / 'theirs')!r})\n"
        "assert 'deepspeed' in sys.modules  # what the probe costs without the guard\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in theirs.iterdir())
    for p in ours.iterdir():
        assert p.read_bytes() == (theirs / p.name).read_bytes(), p.name


def test_a_warm_start_off_a_terminal_says_where_it_is_now_and_then(capsys, monkeypatch):
    """`dapo model build` printed nothing for minutes where output was not a terminal (its bar
    erases itself, so it is off there)."""
    from tasks.models import warm_start

    clock = iter([0.0, 10.0, 31.0, 40.0, 62.0, 70.0, 80.0])  # made, one per step, ...
    monkeypatch.setattr(warm_start.time, "monotonic", lambda: next(clock))
    beat = warm_start._Heartbeat(30.0, 540)
    for step, val in [(1, None), (2, None), (3, 0.25), (4, 0.5)]:
        beat.step(step, 1.0 / step, val)
    assert capsys.readouterr().err.splitlines() == [
        "warm start: step 2 of up to 540, loss 0.500",
        "warm start: step 4 of up to 540, loss 0.250, validation avg@k 0.500",
    ]
    silent = warm_start._Heartbeat(None, 540)  # a terminal: the bar says it
    silent.step(1, 1.0, None)
    assert capsys.readouterr().err == ""


def test_a_reward_model_given_as_a_policy_is_refused_in_one_line(tmp_path):
    """transformers loaded its transformer under a fresh LM head: `dapo evaluate --model RM`
    scored a policy that writes noise, exit 0."""
    from dapo_core.errors import PipelineError
    from tasks.models.learned_reward import RECORD, reward_model_record
    from tasks.models.loading import ModelNotFound, load_policy

    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / RECORD).write_text("{}")
    with pytest.raises(ModelNotFound, match=r"is a reward model .* rollout\.reward_model=PATH"):
        load_policy(str(rm))
    with pytest.raises(PipelineError, match="no such reward model directory"):
        reward_model_record(tmp_path / "missing")  # said "not a reward model directory"


def test_saved_weights_are_as_readable_as_the_directorys_other_files(tiny_cfg, tmp_path):
    """safetensors wrote them owner-only (-rw-------): a shared run's model was unreadable to
    the rest of a team while its config and tokenizer were not."""
    import os
    import stat

    from tasks.models import loading
    from tasks.models.loading import load_policy, save_model_dir

    model, tokenizer = load_policy(str(resolve_model_path(tiny_cfg)))
    old = os.umask(0o027)
    try:
        assert loading._umask() == 0o027  # read without setting it (process-wide)
        out = save_model_dir(model, tokenizer, tmp_path / "m")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir() if p.is_file()}
    assert modes["model.safetensors"] == modes["config.json"] == 0o640, modes
