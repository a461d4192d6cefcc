"""Offline API with vLLM's names: ``LLM(...).generate(prompts, sampling_params)``."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from folovllm.config import EngineConfig
from folovllm.engine.llm_engine import LLMEngine, PromptInput
from folovllm.engine.run_loop import run_until_finished
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams


class LLM:
    """Generates for a list of prompts with continuous batching; results come in input order.

    >>> llm = LLM()  # the embedded default model, SmolLM2-135M-Instruct
    >>> llm.generate(["Hello"], SamplingParams(max_tokens=8))[0].outputs[0].text
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self.llm_engine = LLMEngine(EngineConfig(model=model, **engine_args))

    @property
    def tokenizer(self):
        return self.llm_engine.tokenizer

    @property
    def model_path(self) -> str:
        return self.llm_engine.model_path

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: PromptInput | Sequence[PromptInput],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 user: Sequence[str | None] | None = None) -> list[RequestOutput]:
        """Generates for every prompt; ``priority`` / ``user`` (one per prompt) feed the
        ``priority`` and ``fair`` scheduling policies."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError(f"got {len(sampling_params)} sampling_params for {len(prompts)} prompts")
        # Only the final outputs are returned: the engine need not build one per step.
        final_only = {id(p): p if p.output_kind == "final_only" else dataclasses.replace(p, output_kind="final_only")
                      for p in sampling_params}
        sampling_params = [final_only[id(p)] for p in sampling_params]
        priority = list(priority) if priority is not None else [0] * len(prompts)
        user = list(user) if user is not None else [None] * len(prompts)
        if not len(priority) == len(user) == len(prompts):
            raise ValueError(f"priority and user need one entry per prompt ({len(prompts)})")
        engine = self.llm_engine
        ids = []
        try:
            for prompt, params, prio, tenant in zip(prompts, sampling_params, priority, user):
                ids.append(engine.add_request(prompt, params, priority=prio, user=tenant))
        except ValueError:
            for request_id in ids:  # all or nothing: a bad prompt queues none of the batch
                engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template: str | None = None) -> list[RequestOutput]:
        """Applies the model's chat template to one conversation (or a list of them) and generates."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not getattr(self.tokenizer, "chat_template", None) and chat_template is None:
            raise ValueError("this model has no chat template; pass chat_template= or use generate()")
        prompts = [{"prompt_token_ids": self._apply_template(c, add_generation_prompt, chat_template)}
                   for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _apply_template(self, conversation: list[dict], add_generation_prompt: bool,
                        chat_template: str | None) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
            chat_template=chat_template)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        wanted = set(request_ids)
        bar = tqdm(total=len(request_ids), desc="Generating", disable=not use_tqdm)

        def count_finished(outputs: list[RequestOutput]) -> None:
            bar.update(sum(1 for o in outputs if o.finished and o.request_id in wanted))

        finished = run_until_finished(self.llm_engine, request_ids, on_step=count_finished)
        bar.close()
        return [finished[i] for i in request_ids]

    def reset_prefix_cache(self) -> bool:
        """Drops cached KV blocks that no running request uses (vLLM's name)."""
        self.llm_engine.reset_prefix_cache()
        return True

    def get_kv_cache_stats(self) -> dict:
        return self.llm_engine.get_kv_cache_stats()
