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
    t.is_correct = lambda response, _: len(response) % 2 == 0
    return t
