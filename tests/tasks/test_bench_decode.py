from bench.decode import VARIANTS, attribute, floors_ms, main


def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


def test_kernels_go_to_the_innermost_operator_that_launched_them():
    """A linear (mm inside) onto the vocabulary, another onto the hidden size, a mask add over
    the attention window, a key write and an SDPA call, each launching one kernel; a compiled
    (triton) kernel launched from no operator, and two compiled templates (FlexAttention's, and
    a matrix product max-autotune chose): each kernel's time lands in its part."""
    V, W = 1000, 256
    events = [
        _x("cpu_op", "aten::linear", 0, 10, **{"Input Dims": [[4, 1, 8], [V, 8]]}),
        _x("cpu_op", "aten::mm", 1, 8, **{"Input Dims": [[4, 8], [8, V]]}),
        _x("cuda_runtime", "cudaLaunchKernel", 2, 1, correlation=1),
        _x("kernel", "nvjet_gemm", 20, 7, tid=7, correlation=1),
        _x("cpu_op", "aten::mm", 11, 3, **{"Input Dims": [[4, 8], [8, 8]]}),
        _x("cuda_driver", "cuLaunchKernel", 12, 1, correlation=2),
        _x("kernel", "sm90_gemm", 30, 3, tid=7, correlation=2),
        _x("cpu_op", "aten::add", 15, 2, **{"Input Dims": [[4, 2, 7, W], [4, 1, 1, W]]}),
        _x("cuda_runtime", "cudaLaunchKernel", 16, 0.5, correlation=3),
        _x("kernel", "elementwise", 40, 2, tid=7, correlation=3),
        _x("cpu_op", "aten::index_copy_", 18, 2),
        _x("cuda_runtime", "cudaLaunchKernel", 19, 0.5, correlation=4),
        _x("kernel", "index_copy_kernel", 45, 1, tid=7, correlation=4),
        _x("cpu_op", "aten::scaled_dot_product_attention", 21, 5),
        _x("cpu_op", "aten::_efficient_attention_forward", 22, 3),
        _x("cuda_runtime", "cudaLaunchKernel", 23, 0.5, correlation=5),
        _x("kernel", "fmha_cutlassF", 50, 11, tid=7, correlation=5),
        _x("cuda_driver", "cuLaunchKernelEx", 27, 0.5, correlation=6),
        _x("kernel", "triton_poi_fused_add_mul_0", 60, 4, tid=7, correlation=6),
        _x("cuda_runtime", "cudaLaunchKernel", 28, 0.5, correlation=7),  # outside every op
        _x("kernel", "vectorized_elementwise", 65, 5, tid=7, correlation=7),
        _x("cuda_driver", "cuLaunchKernelEx", 29, 0.5, correlation=8),  # FlexAttention's
        _x("kernel", "triton_tem_fused_0", 70, 6, tid=7, correlation=8),
        _x("cuda_driver", "cuLaunchKernelEx", 31, 0.5, correlation=9),  # max-autotune's product
        _x("kernel", "triton_tem_fused_add_addmm_1", 80, 9, tid=7, correlation=9),
    ]
    parts = attribute(events, window=W, vocab=V)
    assert parts == {
        "lm head": 7,
        "matrix products": 3 + 9,
        "attention": 2 + 11 + 6,
        "kv writes": 1,
        "pointwise": 4 + 5,
    }


def test_floors_count_the_bytes_each_part_must_move(tiny_cfg):
    """By hand for the embedded model's shape in float32 at 1e9 bytes/s: the layers' weights,
    the head's weights and logits, and both key and value windows of every layer."""
    from tasks.models.loading import load_policy
    from tasks.models.resolve import resolve_model_path

    model, _ = load_policy(resolve_model_path(tiny_cfg))
    cfg = model.config
    H, V, n, kv = cfg.hidden_size, cfg.vocab_size, cfg.num_hidden_layers, cfg.num_key_value_heads
    d = H // cfg.num_attention_heads
    layers = sum(p.numel() for p in model.get_decoder().layers.parameters())
    f = floors_ms(model, rows=8, window=128, bandwidth=1e9)
    assert f["matrix products"] == 1000 * 4 * layers / 1e9
    assert f["lm head"] == 1000 * 4 * (V * H + 8 * V) / 1e9
    assert f["attention"] == 1000 * 4 * (2 * n * 8 * kv * 128 * d) / 1e9
    assert f["sampling"] == 1000 * 4 * 8 * V / 1e9


def test_each_variant_decodes_on_cpu(capsys):
    """Off CUDA every variant runs its fixed-shape step eagerly; the table has a row for each
    batch and variant, and the lean one is the baseline of its batch. The samplers asked for
    are timed at each top-p, the flat one at top-p 1 only (the compiled samplers' compilation,
    most of this test's time when it timed them, is tested in test_token_sampling.py)."""
    samplers = ["exact", "flat-eager", "blocked-eager"]
    main(
        ["--model", "tiny", "--batches", "2", "--prompt", "8", "--new", "9"]
        + ["--samplers", *samplers, "--top-p", "0.7"]
    )
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("2 ")]
    variants = [r[1] for r in rows if not r[1][0].isdigit()]  # the sampler rows: numbers
    assert variants == list(VARIANTS)
    assert rows[0][3] == "1.00x"
    heads = [line for line in out.splitlines() if "sampling ms, top-p" in line]
    assert [h.split()[1:] for h in heads] == [
        ["sampling", "ms,", "top-p", "1.0:", "exact", "flat", "eager", "blocked", "eager"],
        ["sampling", "ms,", "top-p", "0.7:", "exact", "blocked", "eager"],
    ]
    timed = [r[1:] for r in rows if r[1][0].isdigit()]
    assert [len(t) for t in timed] == [3, 2]
    assert all(float(ms) > 0 for t in timed for ms in t)


def test_first_calls_go_down_the_batch_sizes_compaction_takes(capsys):
    """--first-calls: one figure per variant and power-of-two batch size, from the largest to 1
    (the sizes a compacting rollout decodes at), and nothing else timed."""
    main(
        ["--model", "tiny", "--first-calls", "--variants", "default", "flex-static"]
        + ["--batches", "4", "--prompt", "8", "--new", "3"]
    )
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    firsts = [line for line in lines if "first" in line]
    assert [line[0] for line in firsts] == ["default", "flex-static"]
    sizes = [[w for w in line if w.startswith(("B=", "(B="))] for line in firsts]
    assert sizes == [["B=4:", "(B=4", "B=2", "B=1"]] * 2
    assert not any("ms/step" in line for line in lines)
