"""Every metric a run logs, named once, with what it measures.

The trainer and ``tasks.training.step_metrics`` write these names; ``dapo_core.ablation_stats``,
``flows.ablate``, the plots and ``dapo metrics`` read them from here. The ``algo`` entries emit
their own metrics by bare name (``clip_frac_high``), logged as ``train/<name>``
(:func:`train`); the ones the built-in entries emit are catalogued below too, so that they have
a meaning and a constant, and a test checks that each is still emitted by some entry.
"""

from __future__ import annotations

import re


def train(name: str) -> str:
    """The logged name of an algorithm entry's metric."""
    return f"train/{name}"


# -- the rollout: every response generated this step, kept by dynamic sampling or not ----------
REWARD_MEAN = "train/reward_mean"
ACC_MEAN = "train/acc_mean"
RESPONSE_LEN_MEAN = "train/response_len_mean"
TRUNCATED_FRAC = "train/truncated_frac"
SAMPLES_GENERATED = "train/samples_generated"
MIXED_GROUP_FRAC = "train/mixed_group_frac"
PARSED_FRAC = "train/parsed_frac"
PROMPTS_TRUNCATED = "train/prompts_truncated"
# -- dynamic sampling --------------------------------------------------------------------------
KEPT_GROUP_FRAC = "train/kept_group_frac"
NUM_GEN_BATCHES = "train/num_gen_batches"
GROUPS_GENERATED = "train/groups_generated"
GROUPS_IN_BATCH = "train/groups_in_batch"
CARRIED_GROUPS = "train/carried_groups"
CARRIED_AGE_MEAN = "train/carried_age_mean"
SAMPLES_PER_KEPT = "train/samples_per_kept"
HIT_GEN_CAP = "train/hit_gen_cap"
DROPPED_GROUPS = "train/dropped_groups"
# -- the training batch --------------------------------------------------------------------------
BATCH_ACC_MEAN = "train/batch_acc_mean"
ADV_ABS_MEAN = "train/adv_abs_mean"
ADV_VAR = "train/adv_var"
TOKENS_TRAINED = "train/tokens_trained"
LONG_WEIGHT_SHARE = "train/long_weight_share"
# -- the updates -------------------------------------------------------------------------------
ENTROPY = "train/entropy"
GRAD_NORM = "train/grad_norm"
LOSS = "train/loss"
LR = "train/lr"
SKIPPED_UPDATES = "train/skipped_updates"
MISMATCH_ABS_LOGP = "train/mismatch_abs_logp"
MISMATCH_KL = "train/mismatch_kl"
MISMATCH_MAX_RATIO = "train/mismatch_max_ratio"
VALUE_GRAD_NORM = "train/value_grad_norm"
# -- emitted by the algorithm entries (dapo_core.algos) ---------------------------------------
CLIP_FRAC_HIGH = train("clip_frac_high")
CLIP_FRAC_LOW = train("clip_frac_low")
CLIP_HIGH_OLD_PROB = train("clip_high_old_prob")
# -- time and throughput -------------------------------------------------------------------------
STEP_TIME = "perf/step_time_s"
GEN_TIME = "perf/gen_time_s"
TRAIN_TIME = "perf/train_time_s"
ROLLOUT_WAIT = "perf/rollout_wait_s"
STALENESS_MEAN = "rollout/staleness_mean"
STALENESS_MAX = "rollout/staleness_max"
TOKENS_PER_S = "perf/tokens_per_s"
PADDING_FRAC = "perf/padding_frac"
PROBE_TIME = "perf/probe_time_s"
VAL_TIME = "perf/val_time_s"
EVAL_TIME = "perf/eval_time_s"
# -- the switch probe (tracking.switch_probe) ----------------------------------------------------
ENTROPY_BEFORE = "probe/entropy_before"
ENTROPY_ON = "probe/entropy_on"
ENTROPY_OFF = "probe/entropy_off"
ENTROPY_DELTA = "probe/entropy_delta"
# -- evaluation (``val/*`` during training: the same names on the validation split) ------------
AVG_AT_K = "eval/avg_at_k"
AVG_AT_K_CI_LOW = "eval/avg_at_k_ci_low"
AVG_AT_K_CI_HIGH = "eval/avg_at_k_ci_high"
PASS_AT_K = "eval/pass_at_{k}"  # one for each k in eval.pass_k up to eval.n_samples
MAJ_AT_K = "eval/maj_at_k"
UNPARSEABLE_FRAC = "eval/unparseable_frac"
EVAL_RESPONSE_LEN_MEAN = "eval/response_len_mean"
EVAL_TRUNCATED_FRAC = "eval/truncated_frac"
NUM_PROBLEMS = "eval/num_problems"
N_SAMPLES = "eval/n_samples"
VAL_AVG_AT_K = "val/avg_at_k"
# -- the preflight, logged at step 0 of a run (dapo_core.signal.GroupSignal's shares) ----------
PREFLIGHT_SHARES = (
    "mixed_group_frac",
    "all_wrong_frac",
    "all_right_frac",
    "parsed_frac",
    "truncated_frac",
)
PREFLIGHT_GROUPS = "preflight/groups_with_{k}_correct"  # k = 0..G

CATALOGUE: dict[str, str] = {
    REWARD_MEAN: "mean shaped reward of every response generated (Eq. 7, or the reward model's "
    "score under rollout.reward=model; + Eq. 13 when on)",
    ACC_MEAN: "share of every generated response that is correct (the rule, whatever the reward)",
    RESPONSE_LEN_MEAN: "mean length of the generated responses (tokens)",
    TRUNCATED_FRAC: "share of responses cut off at rollout.max_response_len",
    SAMPLES_GENERATED: "responses generated this step, dynamic sampling's extra batches included",
    MIXED_GROUP_FRAC: "share of groups with both correct and wrong responses (a learning signal)",
    PARSED_FRAC: "share of responses with an answer the reward could read",
    PROMPTS_TRUNCATED: "prompts cut to rollout.max_prompt_len",
    KEPT_GROUP_FRAC: "share of generated groups dynamic sampling kept (not all-equal rewards)",
    NUM_GEN_BATCHES: "generation batches it took to fill the training batch",
    GROUPS_GENERATED: "groups generated this step",
    GROUPS_IN_BATCH: "groups in the training batch",
    CARRIED_GROUPS: "kept groups carried over to the next step",
    CARRIED_AGE_MEAN: "mean age (steps) of the training batch's groups (0: all fresh)",
    SAMPLES_PER_KEPT: "groups generated per kept group (1 / the kept share)",
    HIT_GEN_CAP: "1 when algo.max_gen_batches was reached before the batch filled",
    DROPPED_GROUPS: "kept groups dropped beyond the carry cap (one batch's worth)",
    BATCH_ACC_MEAN: "share of the training batch's responses that are correct",
    ADV_ABS_MEAN: "mean |advantage| of the training batch's responses",
    ADV_VAR: "variance of the training batch's response advantages (each its token mean)",
    TOKENS_TRAINED: "response tokens the step's loss is computed on",
    LONG_WEIGHT_SHARE: "loss weight on the longer half of the responses (token- vs sample-level)",
    ENTROPY: "mean token entropy of the policy over the updates' tokens (nats)",
    GRAD_NORM: "gradient norm before clipping, mean over the step's updates",
    LOSS: "aggregated loss, mean over the step's updates",
    LR: "learning rate of the step (after warm-up)",
    SKIPPED_UPDATES: "updates skipped for a non-finite loss or gradient",
    MISMATCH_ABS_LOGP: "mean |log pi_old - log pi_rollout| over freshly sampled tokens",
    MISMATCH_KL: "k3 KL(rollout || old) over freshly sampled tokens",
    MISMATCH_MAX_RATIO: "largest pi_old / pi_rollout over freshly sampled tokens",
    VALUE_GRAD_NORM: "the critic's gradient norm before clipping, mean over the updates (PPO)",
    CLIP_FRAC_HIGH: "share of tokens whose ratio the upper clip (1 + eps_high) bound",
    CLIP_FRAC_LOW: "share of tokens whose ratio the lower clip (1 - eps_low) bound",
    CLIP_HIGH_OLD_PROB: "mean pi_old of the tokens clipped above (DAPO 3.1's premise)",
    STEP_TIME: "wall time of the step (s)",
    GEN_TIME: "time spent generating (s)",
    TRAIN_TIME: "time spent on loss inputs and updates (s)",
    ROLLOUT_WAIT: "time the trainer waited for the rollout process's batch (s; rollout ranks)",
    STALENESS_MEAN: "updates between the batch's sampling policy and the trained one, group mean",
    STALENESS_MAX: "the same, the batch's largest (carried groups can be older)",
    TOKENS_PER_S: "generated plus trained tokens per second of the step",
    PADDING_FRAC: "share of padding in this rank's micro-batches",
    PROBE_TIME: "time the switch probe added to the step (s)",
    VAL_TIME: "time of a validation pass (s)",
    EVAL_TIME: "time of the held-out evaluation (s)",
    ENTROPY_BEFORE: "entropy over the step's responses before its update",
    ENTROPY_ON: "the same, after the update with the probed switch on",
    ENTROPY_OFF: "the same, after the update with the probed switch off",
    ENTROPY_DELTA: "on minus off: the switch's effect on entropy in one step",
    AVG_AT_K: "held-out accuracy averaged over eval.n_samples samples a problem (avg@k)",
    AVG_AT_K_CI_LOW: "lower end of avg@k's bootstrap CI over problems",
    AVG_AT_K_CI_HIGH: "upper end of avg@k's bootstrap CI over problems",
    PASS_AT_K: "unbiased pass@k: the chance that k of a problem's n samples hold a right one",
    MAJ_AT_K: "share of problems whose most frequent answer (by value) is right",
    UNPARSEABLE_FRAC: "share of samples with no answer the reward could read (scored wrong)",
    EVAL_RESPONSE_LEN_MEAN: "mean length of the evaluation's samples (tokens)",
    EVAL_TRUNCATED_FRAC: "share of the evaluation's samples cut off at the length limit",
    NUM_PROBLEMS: "problems evaluated",
    N_SAMPLES: "samples a problem (eval.n_samples)",
    **{
        f"preflight/{share}": f"the preflight's {share.replace('_', ' ')} over its groups "
        "(before any step: dapo preflight)"
        for share in PREFLIGHT_SHARES
    },
    PREFLIGHT_GROUPS: "the preflight's groups with k of their G responses right",
}
"""Name -> what it measures. Entry metrics not listed here are described by their entry."""

ENTRY_METRICS = (CLIP_FRAC_HIGH, CLIP_FRAC_LOW, CLIP_HIGH_OLD_PROB)
"""The catalogued names the algorithm entries emit (the rest come from the trainer)."""


def describe(name: str) -> str:
    """What a logged metric measures, for any name a run logs."""
    if name in CATALOGUE:
        return CATALOGUE[name]
    if (pattern := re.sub(r"_\d+(_correct)?$", r"_{k}\1", name)) in CATALOGUE:  # pass_at_4
        return CATALOGUE[pattern]
    if name.startswith("val/") and (twin := describe("eval/" + name[4:])):
        return twin + ", on the validation split"
    if name.startswith("train/"):
        return "emitted by an algo entry (see its module in dapo_core/algos)"
    return ""
