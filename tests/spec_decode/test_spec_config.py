import pytest

from folovllm.config import EngineConfig
from folovllm.platforms.cpu import CpuPlatform
from folovllm.spec_decode.config import SpeculativeConfig


def test_ngram_defaults_follow_vllm():
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})
    assert (config.method, config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == \
        ("ngram", 3, 4, 4)
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 1}).prompt_lookup_min == 5


def test_speculation_pauses_where_the_platform_measured_it_unless_told_otherwise():
    base = {"method": "ngram", "num_speculative_tokens": 2}
    assert SpeculativeConfig.from_dict(base).disable_by_batch_size is None  # vLLM's dict semantics
    resolved = EngineConfig(device="cpu", speculative_config=base).resolve().speculative_config
    assert resolved["disable_by_batch_size"] == CpuPlatform.speculation_pause_batch
    for given in (None, 3):
        resolved = EngineConfig(device="cpu", speculative_config={**base, "disable_by_batch_size": given}).resolve()
        assert SpeculativeConfig.from_dict(resolved.speculative_config).disable_by_batch_size == given


def test_model_alone_means_a_draft_model():
    config = SpeculativeConfig.from_dict({"model": "/some/draft", "num_speculative_tokens": 2})
    assert (config.method, config.model) == ("draft_model", "/some/draft")


@pytest.mark.parametrize("spec, message", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "'eagle' is not implemented"),
    ({"method": "bogus", "num_speculative_tokens": 2}, "unknown method 'bogus'"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}, "draft_tensor_parallel_size"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup"),
    ({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}, "disable_by_batch_size"),
    ({"num_speculative_tokens": 2}, "needs 'method'"),
])
def test_bad_configs_name_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(speculative_config=spec)


def test_speculation_turns_overlap_off():
    spec = {"method": "ngram", "num_speculative_tokens": 2}
    assert EngineConfig(speculative_config=spec).resolve().overlap_scheduling is False
    with pytest.raises(ValueError, match="overlap"):
        EngineConfig(speculative_config=spec, overlap_scheduling=True).resolve()
