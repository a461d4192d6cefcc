"""The per-step worker input is plain data: it survives a pickle round trip and carries no torch
Generator, Request or tensor (what a second rank would receive)."""
from __future__ import annotations

import dataclasses
import pickle

import torch

from folovllm import SamplingParams
from folovllm.request import Request
from folovllm.worker.step_input import StepInput
from tests.engine.conftest import make_llm, random_prompts, tiny_llama_dir  # noqa: F401


def walk(value, seen: list) -> None:
    """Every object reachable through dataclass fields, lists, tuples and dicts."""
    seen.append(value)
    if dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            walk(getattr(value, f.name), seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            walk(item, seen)
    elif isinstance(value, dict):
        for key, item in value.items():
            walk(key, seen)
            walk(item, seen)


def test_step_inputs_pickle_and_hold_no_device_state(tiny_llama_dir) -> None:  # noqa: F811
    engine = make_llm(tiny_llama_dir, overlap_scheduling=True, max_num_batched_tokens=16).llm_engine
    sent: list[tuple[StepInput, bytes]] = []
    launch = engine.worker.launch

    def recording_launch(step: StepInput):
        sent.append((step, pickle.dumps(step)))  # as sent: the engine mutates its lists afterwards
        return launch(step)

    engine.worker.launch = recording_launch
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
              SamplingParams(temperature=0.8, seed=3, max_tokens=6, n=2, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=6, repetition_penalty=1.3),
              SamplingParams(temperature=0.0, max_tokens=6, min_tokens=4)]
    for prompt, p in zip(random_prompts(4, seed=1), params):
        engine.add_request({"prompt_token_ids": prompt}, p)
    while engine.has_unfinished_requests():
        engine.step()

    assert sent
    for step, blob in sent:
        loaded = pickle.loads(blob)
        assert isinstance(loaded, StepInput)
        objects: list = []
        walk(loaded, objects)
        assert not any(isinstance(o, (torch.Generator, torch.Tensor, Request)) for o in objects)
    loaded = [pickle.loads(blob) for _, blob in sent]
    rows = [r for step in loaded for r in step.requests]
    decodes = [step.decodes for step in loaded if step.decodes is not None]
    assert decodes and any(r.keep for r in rows)  # kept requests' later steps come as decode rows
    assert any(d.pending_rows for d in decodes)  # overlap: tokens still on the device
    assert any(step.finished_request_ids for step in loaded)
    sampling = [r.sampling for r in rows if r.sampling is not None]
    assert {s.seed for s in sampling} == {None, 3, 4}  # n=2: seed + sample index
    for s in sampling:  # earlier tokens only for the rows whose penalties read them
        assert bool(s.prompt_token_ids) == s.params.has_penalties
