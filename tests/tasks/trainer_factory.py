"""A trainer on a test config's model whose reward is the parity of a response's length: its
groups are mixed from the first step, before the model can answer (shared by the KL and critic
tests)."""

from tasks.data.splits import splits
from tasks.models.loading import load_policy
from tasks.models.resolve import resolve_model_path
from tasks.rollout.generators import HFGenerator
from tasks.training.trainer import DAPOTrainer


def parity_trainer(cfg) -> DAPOTrainer:
    model, tok = load_policy(resolve_model_path(cfg), "float32")
    gen = HFGenerator(model, tok, cfg.rollout.max_prompt_len)
    t = DAPOTrainer(cfg, model, tok, gen, splits(cfg).train)
    t.rollouts.is_correct = lambda response, _: len(response) % 2 == 0
    return t


def parity_scores(monkeypatch) -> None:
    """``run_training``'s trainers score by the response length's parity (mixed groups)."""
    from tasks.training import rollouts

    monkeypatch.setattr(rollouts, "rule_correctness", lambda response, _: len(response) % 2 == 0)


def full_and_resumed(cfg, root, cut_at: int = 2):
    """The same run twice: uninterrupted, and stopped after ``cut_at`` steps then resumed;
    returns both results (``perf/*`` timings aside, their histories must be equal)."""
    from tasks.rundir import RunDir
    from tasks.training.run import run_training

    full = run_training(cfg, RunDir(root / "full"), progress=False)
    run_training(cfg, RunDir(root / "cut"), progress=False, max_steps=cut_at)
    rest = run_training(cfg, RunDir(root / "cut"), resume=True, progress=False)
    return full, rest


def without_timings(history):
    return [{k: v for k, v in r.items() if not k.startswith("perf/")} for r in history]
