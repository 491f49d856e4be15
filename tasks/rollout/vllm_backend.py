"""The vLLM rollout backend (``rollout.backend=vllm``): the same interface as ``HFGenerator``
(``tasks.rollout.generators``), on vLLM's engine, colocated with training on one GPU."""

from __future__ import annotations

import os

from tasks.rollout.generators import Rollouts, encode_prompts


class VLLMGenerator:
    """vLLM sampling (GPU, optional extra ``gpu``), colocated with training on the same GPU.

    The trainer's weights are loaded into the engine before each rollout and the prefix cache is
    reset (its keys and values were computed with the old weights), so samples come from the
    current policy. The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``),
    so its model can be updated in place, parameter by parameter, as TRL's colocate mode does.
    vLLM takes ``gpu_memory`` of the GPU and leaves the rest to training.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer,
        max_prompt_len: int,
        max_model_len: int,
        gpu_memory: float = 0.3,
    ):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            from vllm import LLM
        except ImportError:
            raise RuntimeError(
                "rollout.backend=vllm needs vLLM: pip install -e '.[gpu]' on a CUDA machine, "
                "or use rollout.backend=hf"
            ) from None
        self.llm = LLM(
            model=model_path,
            max_model_len=max_model_len,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory,
        )
        self.tokenizer = tokenizer
        self.max_prompt_len = max_prompt_len

    def _engine_model(self):
        """The engine's model when its worker lives in this process (vLLM V1 in-process, V0)."""
        worker = getattr(
            getattr(self.llm.llm_engine, "model_executor", None), "driver_worker", None
        )
        for runner_owner in (worker, getattr(worker, "worker", None)):
            runner = getattr(runner_owner, "model_runner", None)
            if runner is not None and hasattr(runner, "model"):
                return runner.model
        return None

    def sync_weights(self, model) -> None:
        """Load the trainer's current parameters into the engine, then drop its prefix cache."""
        target = self._engine_model()
        if target is not None:
            for name, param in model.named_parameters():
                target.load_weights([(name, param.detach())])
        else:  # the engine runs in other processes: send the weights over its RPC
            state = {k: v.detach() for k, v in model.state_dict().items()}
            self.llm.collective_rpc(
                lambda self_: self_.model_runner.model.load_weights(state.items())
            )
        self.llm.reset_prefix_cache()

    def generate(
        self, prompts: list[str], n: int, temperature: float, top_p: float, max_new_tokens: int
    ) -> Rollouts:
        from vllm import SamplingParams

        prompt_ids, n_trunc = encode_prompts(self.tokenizer, prompts, self.max_prompt_len)
        # vLLM V1 returns log-probs of the raw distribution (before temperature), V0 of the
        # processed one (after temperature and top-p): both equal the trainer's temperature-scaled,
        # unrestricted distribution only at temperature 1 and top-p 1 (DAPO's), so ask only then.
        want_logprobs = temperature == 1.0 and top_p == 1.0
        params = SamplingParams(
            n=n,
            temperature=temperature,
            top_p=top_p,
            max_tokens=max_new_tokens,
            logprobs=0 if want_logprobs else None,  # 0: the sampled token's alone
        )
        outs = self.llm.generate(
            [{"prompt_token_ids": p} for p in prompt_ids], params, use_tqdm=False
        )
        responses, finished, texts, logprobs = [], [], [], []
        for out in outs:
            for c in out.outputs:
                responses.append(list(c.token_ids))
                finished.append(c.finish_reason == "stop")
                texts.append(c.text)
                if want_logprobs and c.logprobs is not None:
                    pairs = zip(c.token_ids, c.logprobs, strict=True)  # one dict per token
                    logprobs.append([lp[t].logprob for t, lp in pairs])
        complete = want_logprobs and len(logprobs) == len(responses)
        return Rollouts(
            n, prompt_ids, responses, finished, texts, n_trunc, logprobs if complete else None
        )
