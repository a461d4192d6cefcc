"""OutputProcessor: detokenize=False gives the same token ids and stop rules, with no text."""
from __future__ import annotations

import pytest

from folovllm.engine.output_processor import OutputProcessor
from folovllm.request import Request, RequestStatus
from folovllm.sampling_params import SamplingParams


class _NoTokenizer:
    """Fails on any use: with detokenize=False the tokenizer must never be asked."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the tokenizer was used ({name}) with detokenize=False")


def _run(processor: OutputProcessor, params: SamplingParams,
         tokens: list[int]) -> tuple[Request, RequestStatus | None]:
    request = Request("r", [5, 6, 7], params, 0.0, params.max_tokens, eos_token_ids=[2])
    processor.start(request)
    status = None
    for token in tokens:
        status = processor.append_token(request, token)
        if status is not None:
            break
    return request, status


@pytest.mark.parametrize("kwargs, tokens, expected_ids, expected_status", [
    ({"max_tokens": 4, "ignore_eos": True}, [2, 900, 901, 902, 903], [2, 900, 901, 902], RequestStatus.FINISHED_LENGTH),
    ({"max_tokens": 8}, [900, 2, 901], [900, 2], RequestStatus.FINISHED_STOPPED),
    ({"max_tokens": 8, "stop_token_ids": [901]}, [900, 901, 902], [900, 901], RequestStatus.FINISHED_STOPPED),
])
def test_detokenize_false_keeps_ids_and_stop_rules(smol_tokenizer, kwargs, tokens, expected_ids,
                                                   expected_status) -> None:
    with_text, status_text = _run(OutputProcessor(smol_tokenizer, 64), SamplingParams(**kwargs), tokens)
    ids_only, status_ids = _run(OutputProcessor(_NoTokenizer(), 64),
                                SamplingParams(**kwargs, detokenize=False), tokens)
    assert ids_only.output_token_ids == with_text.output_token_ids == expected_ids
    assert status_ids == status_text == expected_status
    assert ids_only.stop_reason == with_text.stop_reason
    assert ids_only.text == "" and with_text.text != ""
