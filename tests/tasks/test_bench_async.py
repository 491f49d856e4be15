import importlib

import pytest

bench = importlib.import_module("bench.async")  # "async" is a keyword: no import statement


def _run(step, gen, update, wait=0.0, avg=0.5, ci=(0.4, 0.6)):
    return dict(step_s=step, gen_s=gen, update_s=update, wait_s=wait, staleness=1.0, avg=avg, ci=ci)


def test_summary_by_hand_overlap_idle_and_the_seeds_interval():
    """Medians of the timings over seeds; the rollout idles step - gen; overlap is the step
    over max(gen, update); avg@8's interval over seeds is mean +/- 1.96 sd / sqrt(n)."""
    runs = [
        _run(1.0, 0.3, 0.9, avg=0.5),
        _run(1.2, 0.4, 1.0, avg=0.7),
        _run(1.1, 0.2, 0.8, avg=0.6),
    ]
    s = bench.summarize(runs)
    assert s["step_s"] == 1.1 and s["gen_s"] == 0.3 and s["update_s"] == 0.9
    assert s["idle_s"] == pytest.approx(0.8) and s["overlap"] == pytest.approx(1.1 / 0.9)
    assert s["avg"] == pytest.approx(0.6)
    half = 1.96 * 0.1 / 3**0.5  # the sample sd of 0.5, 0.7, 0.6 is 0.1
    assert s["ci"] == pytest.approx((0.6 - half, 0.6 + half))
    one = bench.summarize([_run(1.0, 0.3, 0.9, ci=(0.41, 0.62))])
    assert one["ci"] == (0.41, 0.62)  # one seed: the evaluation's own bootstrap interval


def test_table_compares_each_setting_with_sync():
    rows = {
        "sync": bench.summarize([_run(1.2, 0.3, 0.9)]),
        "s1": bench.summarize([_run(0.8, 0.3, 0.75)]),
    }
    lines = bench.table(rows).splitlines()
    assert lines[1].split()[:3] == ["sync", "50.0", "1.00x"]
    assert lines[2].split()[:3] == ["s1", "75.0", "1.50x"]
    assert "1.07" in lines[2].split()  # 0.8 / max(0.3, 0.75): the overlap column


def test_an_unknown_setting_is_a_usage_error(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--settings", "sync,s9"])
    assert "unknown setting 's9'" in capsys.readouterr().err
