"""Architecture registry: each model file registers its class; GGUF names come from the classes."""
from __future__ import annotations

import pytest

from folovllm.model.gemma3 import Gemma3ForCausalLM
from folovllm.model.llama import LlamaForCausalLM
from folovllm.model.qwen2 import Qwen2ForCausalLM
from folovllm.model.qwen3 import Qwen3ForCausalLM
from folovllm.model.registry import (
    architecture_for_gguf,
    get_model_class,
    register_model,
)


def test_each_model_file_registers_its_architecture() -> None:
    assert get_model_class("LlamaForCausalLM") is LlamaForCausalLM
    assert get_model_class("Qwen2ForCausalLM") is Qwen2ForCausalLM
    assert get_model_class("Qwen3ForCausalLM") is Qwen3ForCausalLM
    assert get_model_class("Gemma3ForCausalLM") is Gemma3ForCausalLM
    with pytest.raises(ValueError, match=r"'Gemma2ForCausalLM' is not supported; supported: \['Gemma3ForCausalLM'"):
        get_model_class("Gemma2ForCausalLM")
    with pytest.raises(ValueError, match="registered twice"):
        register_model("LlamaForCausalLM")(LlamaForCausalLM)


def test_gguf_architecture_names_and_qk_permute_come_from_the_model_classes() -> None:
    assert architecture_for_gguf("llama") == "LlamaForCausalLM"
    assert architecture_for_gguf("qwen3") == "Qwen3ForCausalLM"
    assert architecture_for_gguf("gemma3") == "Gemma3ForCausalLM"
    with pytest.raises(ValueError, match=r"GGUF architecture 'gemma2' in 'x.gguf' is not supported; "
                                         r"supported: \['gemma3', 'llama', 'qwen2', 'qwen3'\]"):
        architecture_for_gguf("gemma2", "x.gguf")
    assert LlamaForCausalLM.gguf_qk_permuted and not Gemma3ForCausalLM.gguf_qk_permuted
    assert not Qwen2ForCausalLM.gguf_qk_permuted and not Qwen3ForCausalLM.gguf_qk_permuted
