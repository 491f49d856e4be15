import gzip
import json

from bench.gaps import gaps, load, main, merge


def _x(cat, name, ts, dur):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_merge_unions_overlapping_and_touching_intervals():
    assert merge([(5, 7), (0, 2), (1, 3), (3, 4)]) == [(0, 4), (5, 7)]


def test_gaps_by_hand_with_the_host_ops_and_runtime_calls_inside():
    """Host op 'update' from 0 to 100 us with 'step' inside at 60-90; kernels at 10-20, 15-30
    and 80-100: the device is busy 20 + 20 = 40 us of 100, idle 60: a 10 us gap before the
    first kernel (host-only 0-10) and a 50 us gap 30-80, in the middle of which (55) only
    'update' runs, with a synchronising call inside; the first holds the launch that ends it."""
    events = [
        _x("cpu_op", "update", 0, 100),
        _x("cpu_op", "step", 60, 30),
        _x("kernel", "a", 10, 10),
        _x("kernel", "b", 15, 15),
        _x("gpu_memcpy", "c", 80, 20),
        _x("cuda_runtime", "cudaStreamSynchronize", 40, 5),
        _x("cuda_runtime", "cudaLaunchKernel", 9, 1),
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 50},  # not a span: ignored
    ]
    summary, found = gaps(events, min_us=5)
    assert summary == {"wall_us": 100, "busy_us": 40, "idle_us": 60}
    assert [(g.start, g.dur) for g in found] == [(30, 50), (0, 10)]
    assert found[0].host_ops == ["update"] and found[0].runtime == ["cudaStreamSynchronize"]
    assert found[1].runtime == ["cudaLaunchKernel"] and found[1].host_ops == ["update"]
    assert [g.dur for g in gaps(events, min_us=20)[1]] == [50]


def test_cli_reads_a_gzipped_trace_and_refuses_one_without_kernels(tmp_path, capsys):
    path = tmp_path / "t.json.gz"
    events = [_x("cpu_op", "update", 0, 100), _x("kernel", "a", 40, 60)]
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    assert load(str(path)) == events
    main([str(path), "--min-us", "1"])
    out = capsys.readouterr().out
    assert "device busy 0.1 ms (60%)" in out and "update" in out
    cpu_only = tmp_path / "cpu.json"
    cpu_only.write_text(json.dumps([_x("cpu_op", "update", 0, 100)]))
    try:
        main([str(cpu_only)])
    except SystemExit as e:
        assert "no device kernels" in str(e)
    else:
        raise AssertionError("a trace without kernels should be refused")
