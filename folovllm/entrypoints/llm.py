"""Offline API with vLLM's names: ``LLM(...).generate(prompts, sampling_params)``."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from folovllm.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence, best_finished, expand
from folovllm.config import EngineConfig
from folovllm.engine.llm_engine import LLMEngine, PromptInput
from folovllm.engine.metrics_reader import Metric, engine_metrics
from folovllm.engine.run_loop import run_until_finished
from folovllm.lora.request import LoRARequest
from folovllm.outputs import (
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingOutput,
    PoolingRequestOutput,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from folovllm.pooling.score import cosine_scores, pair_up
from folovllm.pooling_params import PoolingParams
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

    def embed(self, prompts: PromptInput | Sequence[PromptInput], pooling_params: PoolingParams | None = None,
              use_tqdm: bool = True, truncate_prompt_tokens: int | None = None) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (a pooling engine: ``runner="pooling"``), in input order."""
        params = self._pooling_params(pooling_params, "embed", truncate_prompt_tokens)
        return [EmbeddingRequestOutput(o.request_id, EmbeddingOutput(o.pooled), o.prompt_token_ids)
                for o in self._pool(prompts, params, use_tqdm)]

    def encode(self, prompts: PromptInput | Sequence[PromptInput], pooling_params: PoolingParams | None = None,
               use_tqdm: bool = True, truncate_prompt_tokens: int | None = None) -> list[PoolingRequestOutput]:
        """Each prompt's pooled hidden states as a tensor: a vector, or one row per token (pooling type ALL)."""
        params = self._pooling_params(pooling_params, "encode", truncate_prompt_tokens)
        return [PoolingRequestOutput(o.request_id, PoolingOutput(torch.tensor(o.pooled)), o.prompt_token_ids)
                for o in self._pool(prompts, params, use_tqdm)]

    def score(self, data_1: PromptInput | Sequence[PromptInput], data_2: PromptInput | Sequence[PromptInput],
              use_tqdm: bool = True, pooling_params: PoolingParams | None = None,
              truncate_prompt_tokens: int | None = None) -> list[ScoringRequestOutput]:
        """Each pair's score: the cosine similarity of their embeddings, or a cross-encoder's
        (``*ForSequenceClassification``) score of the pair; ``data_1`` one text against each of ``data_2``,
        or the two lists pair by pair (vLLM's pairing); one output per pair."""
        firsts, seconds = pair_up(data_1, data_2, (str, dict))
        params = self._pooling_params(pooling_params, "score", truncate_prompt_tokens)
        if self.llm_engine.cross_encoder:
            return self._cross_encode(firsts, seconds, params, use_tqdm)
        unique = list({_prompt_key(p): p for p in firsts + seconds}.values())
        embedded = {_prompt_key(p): o for p, o in zip(unique, self._pool(unique, params, use_tqdm))}
        left = [embedded[_prompt_key(p)] for p in firsts]
        right = [embedded[_prompt_key(p)] for p in seconds]
        scores = cosine_scores([o.pooled for o in left], [o.pooled for o in right])
        return [ScoringRequestOutput(f"{a.request_id}_{b.request_id}", ScoringOutput(score),
                                     a.prompt_token_ids + b.prompt_token_ids)
                for a, b, score in zip(left, right, scores)]

    def _cross_encode(self, firsts: list, seconds: list, params: PoolingParams,
                      use_tqdm: bool) -> list[ScoringRequestOutput]:
        """A cross-encoder's scores: each pair tokenized as one input (the tokenizer's pair form), scored by its head."""
        if not all(isinstance(text, str) for text in firsts + seconds):
            raise ValueError("a cross-encoder scores pairs of texts: give strings")
        prompts = [{"prompt_token_ids": self.tokenizer(a, b)["input_ids"]} for a, b in zip(firsts, seconds)]
        return [ScoringRequestOutput(o.request_id, ScoringOutput(o.pooled[0]), o.prompt_token_ids)
                for o in self._pool(prompts, params, use_tqdm)]

    @staticmethod
    def _pooling_params(given: PoolingParams | None, task: str, truncate: int | None) -> PoolingParams:
        params = dataclasses.replace(given or PoolingParams(), task=task)
        return params if truncate is None else dataclasses.replace(params, truncate_prompt_tokens=truncate)

    def _pool(self, prompts: PromptInput | Sequence[PromptInput], params: PoolingParams,
              use_tqdm: bool) -> list[RequestOutput]:
        """Queues every prompt as a pooling request, all or nothing; their finished outputs in input order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        engine, ids = self.llm_engine, []
        try:
            for prompt in prompts:
                ids.append(engine.add_request(prompt, params))
        except ValueError:
            for request_id in ids:
                engine.abort_request(request_id)
            raise
        return self._run(ids, use_tqdm)

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


def _prompt_key(prompt: PromptInput) -> tuple[str, str]:
    """A prompt as a dict key: the same text (or token ids) is embedded once."""
    return ("text", prompt) if isinstance(prompt, str) else ("dict", repr(prompt))
