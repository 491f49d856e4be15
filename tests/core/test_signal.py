"""The learning signal of sampled groups, by hand."""

import torch

from dapo_core.signal import diagnose, group_signal

T, F = True, False


def test_group_signal_by_hand():
    acc = torch.tensor([[T, F, F, F], [F, F, F, F], [T, T, T, T], [T, T, F, F]])
    parsed = torch.tensor([[T, T, T, F], [T, F, F, F], [T, T, T, T], [T, T, T, T]])
    finished = torch.tensor([[T, T, T, F], [T, T, T, T], [T, T, T, T], [T, T, T, T]])
    s = group_signal(acc, parsed, finished)
    assert s.mixed_group_frac == 0.5  # groups 0 and 3
    assert s.all_wrong_frac == 0.25 and s.all_right_frac == 0.25
    assert s.parsed_frac == 12 / 16 and s.truncated_frac == 1 / 16
    assert s.pass_rate_hist == (1, 1, 1, 0, 1)  # groups with 0, 1, 2, 3, 4 correct


def test_diagnose_names_the_cause():
    mixed = group_signal(
        torch.tensor([[T, F]] * 4),
        torch.ones(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
    )
    assert diagnose(mixed, 0.1) is None
    none_parsed = group_signal(
        torch.zeros(4, 2, dtype=torch.bool),
        torch.zeros(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
    )
    assert "parseable answer" in diagnose(none_parsed, 0.1)
    hard = group_signal(
        torch.zeros(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
    )
    assert "too hard" in diagnose(hard, 0.1)
    easy = group_signal(
        torch.ones(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
        torch.ones(4, 2, dtype=torch.bool),
    )
    assert "too easy" in diagnose(easy, 0.1)


def test_responses_cut_before_their_answer_name_the_length_limit_too():
    """Every response truncated and none parseable: the advice was only to teach the format,
    where a limit too short for the answers cuts them the same way."""
    zeros = torch.zeros(4, 2, dtype=torch.bool)
    cut = group_signal(zeros, zeros, zeros)  # none right, none parsed, none finished
    said = diagnose(cut, 0.1)
    assert "100% of responses are cut" in said and "raise rollout.max_response_len" in said
    half_cut = group_signal(zeros, zeros, torch.tensor([[T, T], [T, T], [F, F], [T, F]]))
    said = diagnose(half_cut, 0.1)  # 3 of 8 cut: the format's doing
    assert "parseable answer" in said and "max_response_len" not in said
