"""Offline API with vLLM's names: ``LLM(...).generate(prompts, sampling_params)``."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from folovllm.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence, best_finished, expand
from folovllm.config import EngineConfig
from folovllm.engine.llm_engine import LLMEngine, PromptInput
from folovllm.engine.metrics_reader import Metric, engine_metrics
from folovllm.engine.run_loop import run_until_finished
from folovllm.lora.request import LoRARequest
from folovllm.outputs import RequestOutput
from folovllm.sampling_params import SamplingParams

_ENGINE_ARGS = frozenset(f.name for f in dataclasses.fields(EngineConfig))


class LLM:
    """Generates for a list of prompts with continuous batching; results come in input order.

    >>> llm = LLM()  # the embedded default model, SmolLM2-135M-Instruct
    >>> llm.generate(["Hello"], SamplingParams(max_tokens=8))[0].outputs[0].text
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        """``model``: a .gguf file, an HF folder or a hub id; ``engine_args``: EngineConfig's fields
        (vLLM's names: tensor_parallel_size, tokenizer, quantization, seed, ...)."""
        unknown = sorted(set(engine_args) - _ENGINE_ARGS)
        if unknown:
            raise ValueError(f"unknown engine argument(s) {unknown}; the known ones are EngineConfig's "
                             "fields (folovllm/config.py)")
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
                 user: Sequence[str | None] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generates for every prompt; ``priority`` / ``user`` (one per prompt) feed the
        ``priority`` and ``fair`` scheduling policies; ``lora_request``: one adapter for every prompt, or
        one (or None: the base model) per prompt (``enable_lora=True``)."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
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
        loras = list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(prompts)
        if not len(priority) == len(user) == len(loras) == len(prompts):
            raise ValueError(f"priority, user and a list of lora_request need one entry per prompt ({len(prompts)})")
        engine = self.llm_engine
        ids = []
        try:
            for prompt, params, prio, tenant, lora in zip(prompts, sampling_params, priority, user, loras):
                ids.append(engine.add_request(prompt, params, priority=prio, user=tenant, lora_request=lora))
        except ValueError:
            for request_id in ids:  # all or nothing: a bad prompt queues none of the batch
                engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True,
             chat_template: str | None = None, chat_template_kwargs: dict | None = None,
             continue_final_message: bool = False, tools: list[dict] | None = None) -> list[RequestOutput]:
        """Applies the model's chat template to one conversation (or a list of them) and generates.

        As vLLM's: ``tools`` and ``chat_template_kwargs`` (e.g. ``enable_thinking``) reach the template;
        ``continue_final_message`` (with ``add_generation_prompt=False``) extends the last message."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        if not getattr(self.tokenizer, "chat_template", None) and chat_template is None:
            raise ValueError("this model has no chat template; pass chat_template= or use generate()")
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true: "
                             "pass add_generation_prompt=False to continue the last message")
        render = dict(add_generation_prompt=add_generation_prompt, chat_template=chat_template, tools=tools,
                      continue_final_message=continue_final_message, **(chat_template_kwargs or {}))
        prompts = [self._apply_template(c, render) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm)

    def _apply_template(self, conversation: list[dict], render: dict) -> dict:
        """The rendered conversation as a prompt: its token ids, and its text as the output's ``prompt``."""
        text = self.tokenizer.apply_chat_template(conversation, tokenize=False, **render)
        return {"prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False), "prompt": text}

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json settings (``generation_config="auto"``)
        as defaults; what ``generate`` uses when no sampling params are given."""
        return SamplingParams(**self.llm_engine.default_sampling)

    def beam_search(self, prompts: PromptInput | Sequence[PromptInput], params: BeamSearchParams,
                    use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search over the engine, one token per step for every live beam of every prompt
        (folovllm/beam_search.py); results in input order, each with its best ``beam_width`` beams."""
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts
                                                 and isinstance(prompts[0], int)):
            prompts = [prompts]
        engine = self.llm_engine
        eos = engine.eos_token_ids
        step = SamplingParams(max_tokens=1, logprobs=2 * params.beam_width, temperature=params.temperature,
                              ignore_eos=True, detokenize=False)
        live = [[BeamSearchSequence(engine.tokenize(p)[1])] for p in prompts]
        prompt_lens = [len(beams[0].tokens) for beams in live]
        finished: list[list[BeamSearchSequence]] = [[] for _ in prompts]
        for _ in tqdm(range(params.max_tokens), desc="Beam search", disable=not use_tqdm):
            for i, beams in enumerate(live):  # a beam that fills max_model_len ends there
                finished[i] += [b for b in beams if len(b.tokens) >= engine.max_model_len]
                live[i] = [b for b in beams if len(b.tokens) < engine.max_model_len]
            flat = [beam for beams in live for beam in beams]
            if not flat:
                break
            outputs = self.generate([{"prompt_token_ids": b.tokens} for b in flat], step, use_tqdm=False)
            step_logprobs = iter(out.outputs[0].logprobs[0] for out in outputs)
            for i, beams in enumerate(live):
                live[i], ended = expand(beams, [next(step_logprobs) for _ in beams], params, eos)
                finished[i] += ended
        results = []
        for i, beams in enumerate(live):
            for beam in beams + finished[i]:
                beam.finish_reason = beam.finish_reason or "length"
            best = best_finished(finished[i] + beams, params, eos)
            for beam in best:
                beam.text = self.tokenizer.decode(beam.tokens[prompt_lens[i]:], skip_special_tokens=True)
            results.append(BeamSearchOutput(best))
        return results

    def get_metrics(self) -> list[Metric]:
        """The engine's counters and gauges now (vLLM's ``get_metrics`` shape; /metrics' names)."""
        engine = self.llm_engine
        return engine_metrics(engine.stats, len(engine.scheduler.running), len(engine.scheduler.waiting),
                              engine.kv_cache.usage, os.path.basename(engine.model_path.rstrip("/")))

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
