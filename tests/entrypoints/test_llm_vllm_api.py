"""The offline API's vLLM names on a tiny random Llama loaded by hub id from a test-built cache."""
from __future__ import annotations

import pytest
import torch

from folovllm import LLM, BeamSearchParams, SamplingParams, TextPrompt, TokensPrompt
from folovllm.engine.metrics_reader import Counter, Gauge
from tests.tiny_hub import TINY_REPO_ID

PROMPT_IDS = [[1, 504, 3458, 282], [1, 2771, 30, 216, 17, 28]]


@pytest.fixture(scope="module")
def tiny_llm(tiny_hub):
    hf_home, _ = tiny_hub
    return LLM(TINY_REPO_ID, download_dir=str(hf_home / "hub"), dtype="float32", max_model_len=256,
               kv_cache_memory="64MiB", tensor_parallel_size=1, trust_remote_code=False, quantization=None,
               disable_log_stats=False, seed=0, max_logprobs=6)  # beam width 3 asks for 6


def test_hub_id_loads_from_the_cache_with_its_generation_config(tiny_llm, tiny_hub) -> None:
    assert tiny_llm.model_path == str(tiny_hub[1])
    defaults = tiny_llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.5, 5)
    out = tiny_llm.generate([TokensPrompt(prompt_token_ids=PROMPT_IDS[0])], use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) <= 5  # max_new_tokens from generation_config.json


def test_text_and_token_prompts(tiny_llm) -> None:
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    text = "The capital of France is"
    ids = tiny_llm.tokenizer.encode(text)
    by_text, by_ids = tiny_llm.generate([TextPrompt(prompt=text), TokensPrompt(prompt_token_ids=ids)], greedy,
                                        use_tqdm=False)
    assert by_text.prompt == text and by_text.prompt_token_ids == ids
    assert by_text.outputs[0].token_ids == by_ids.outputs[0].token_ids


def test_logprobs_carry_decoded_text(tiny_llm) -> None:
    out = tiny_llm.generate(TokensPrompt(prompt_token_ids=PROMPT_IDS[0]),
                            SamplingParams(temperature=0, max_tokens=3, logprobs=2, ignore_eos=True), use_tqdm=False)[0]
    for step in out.outputs[0].logprobs:
        for token_id, logprob in step.items():
            assert logprob.decoded_token == tiny_llm.tokenizer.decode([token_id])
    with pytest.raises(ValueError, match="max_logprobs=6"):
        tiny_llm.generate("x", SamplingParams(logprobs=7, max_tokens=1), use_tqdm=False)


def test_get_metrics_has_vllms_shape(tiny_llm) -> None:
    tiny_llm.generate(TokensPrompt(prompt_token_ids=PROMPT_IDS[1]), SamplingParams(max_tokens=2), use_tqdm=False)
    metrics = {m.name: m for m in tiny_llm.get_metrics() if not m.labels.get("finished_reason")}
    assert isinstance(metrics["folovllm:num_requests_running"], Gauge)
    assert isinstance(metrics["folovllm:generation_tokens"], Counter)
    assert metrics["folovllm:generation_tokens"].value >= 2 and metrics["folovllm:prompt_tokens"].value >= 6


def test_unknown_or_unimplemented_engine_arguments_are_errors(tiny_hub) -> None:
    with pytest.raises(ValueError, match="unknown engine argument"):
        LLM(TINY_REPO_ID, tokenizer_mode="slow")
    with pytest.raises(ValueError, match="data parallelism is a server feature"):
        LLM(TINY_REPO_ID, data_parallel_size=2)


def reference_beam_search(model, prompt: list[int], width: int, steps: int) -> list[tuple[list[int], float]]:
    """Beam search by brute force: every beam extended by every vocabulary token, full forward passes (on the
    model's device)."""
    beams = [(list(prompt), 0.0)]
    for _ in range(steps):
        candidates = []
        for tokens, score in beams:
            with torch.no_grad():
                logits = model(torch.tensor([tokens], device=model.device)).logits[0, -1]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
            candidates += [(tokens + [t], score + lp) for t, lp in enumerate(logprobs.tolist())]
        beams = sorted(candidates, key=lambda c: c[1], reverse=True)[:width]
    return beams


def test_beam_search_matches_brute_force(tiny_llm, tiny_hub) -> None:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_hub[1], dtype=torch.float32).eval()
    params = BeamSearchParams(beam_width=3, max_tokens=3, ignore_eos=True)
    outputs = tiny_llm.beam_search([TokensPrompt(prompt_token_ids=p) for p in PROMPT_IDS], params)
    for prompt, output in zip(PROMPT_IDS, outputs):
        expected = reference_beam_search(hf, prompt, 3, 3)
        assert [s.tokens for s in output.sequences] == [tokens for tokens, _ in expected]
        for seq, (_, score) in zip(output.sequences, expected):
            assert seq.cum_logprob == pytest.approx(score, abs=1e-3)
            assert seq.finish_reason == "length" and len(seq.logprobs) == 3
            assert seq.text == tiny_llm.tokenizer.decode(seq.tokens[len(prompt):], skip_special_tokens=True)


def test_beam_search_params_are_checked() -> None:
    with pytest.raises(ValueError, match="beam_width"):
        BeamSearchParams(beam_width=11, max_tokens=4)


def test_tokenizer_from_another_path_and_hf_overrides(tiny_hub, smol_tokenizer, tmp_path) -> None:
    hf_home, snapshot = tiny_hub
    tokenizer_dir = tmp_path / "tokenizer"
    smol_tokenizer.save_pretrained(tokenizer_dir)
    (tokenizer_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")  # transformers reads it first
    llm = LLM(str(snapshot), tokenizer=str(tokenizer_dir), hf_overrides={"max_position_embeddings": 128},
              dtype="float32", kv_cache_memory="64MiB", generation_config="vllm")
    assert llm.llm_engine.max_model_len == 128  # the override, not config.json's 256
    out = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt == "Hi!"  # the other tokenizer's chat template
    assert llm.get_default_sampling_params() == SamplingParams()  # "vllm": not the model's generation config


def test_beams_end_at_max_model_len(tiny_llm) -> None:
    prompt = [1] + [504] * 253  # room for two more tokens within max_model_len=256
    output = tiny_llm.beam_search(TokensPrompt(prompt_token_ids=prompt),
                                  BeamSearchParams(beam_width=2, max_tokens=5, ignore_eos=True))[0]
    assert [len(s.tokens) for s in output.sequences] == [256, 256]
    assert all(s.finish_reason == "length" for s in output.sequences)
