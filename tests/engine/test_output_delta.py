"""Deltas from the engine core rebuild exactly the cumulative outputs the engine produced."""
from hypothesis import given, settings
from hypothesis import strategies as st

from folovllm.engine.output_delta import DeltaDecoder, DeltaEncoder
from folovllm.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

# One step of one sample: how many tokens it gains, and how many trailing characters the stop cut drops.
step = st.tuples(st.integers(0, 3), st.integers(0, 2))


def _outputs(request_id: str, plan: list[list[tuple[int, int]]], with_logprobs: bool) -> list[RequestOutput]:
    """The cumulative outputs an engine would hand out for ``plan`` (steps x samples)."""
    samples = [CompletionOutput(i, "", [], 0.0 if with_logprobs else None, [] if with_logprobs else None)
               for i in range(len(plan[0]))]
    result = []
    for n, per_sample in enumerate(plan):
        last = n == len(plan) - 1
        for s, (gain, cut) in zip(samples, per_sample):
            new = [len(s.token_ids) + k for k in range(gain)]
            s.token_ids = s.token_ids + new
            s.text = (s.text + "".join(f"<{t}>" for t in new))
            s.text = s.text[:max(0, len(s.text) - cut)]
            if with_logprobs:
                s.logprobs = s.logprobs + [{t: Logprob(-0.5, 1)} for t in new]
                s.cumulative_logprob -= 0.5 * gain
            s.finish_reason = "stop" if last else None
        result.append(RequestOutput(request_id, "prompt", [1, 2, 3],
                                    [CompletionOutput(**vars(s)) for s in samples], last,
                                    RequestMetrics(float(n)), num_cached_tokens=16))
    return result


@settings(max_examples=60, deadline=None)
@given(plan=st.lists(st.lists(step, min_size=2, max_size=2), min_size=1, max_size=8),
       with_logprobs=st.booleans())
def test_decode_of_encode_is_the_cumulative_output(plan, with_logprobs):
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    for expected in _outputs("r", plan, with_logprobs):
        assert decoder.decode(encoder.encode(expected)) == expected
    assert not encoder._sent and not decoder._last  # finished: both sides forgot it


def test_deltas_carry_only_what_is_new():
    encoder = DeltaEncoder()
    outputs = _outputs("r", [[(3, 0)], [(1, 0)], [(1, 2)]], with_logprobs=False)
    deltas = [encoder.encode(o) for o in outputs]
    assert deltas[0].prompt_token_ids == [1, 2, 3] and deltas[1].prompt_token_ids is None
    assert [d.samples[0].new_token_ids for d in deltas] == [[0, 1, 2], [3], [4]]
    assert deltas[2].samples[0].text_keep == len(outputs[1].outputs[0].text)


def test_forget_drops_an_aborted_request_on_both_sides():
    encoder, decoder = DeltaEncoder(), DeltaDecoder()
    first = _outputs("a", [[(2, 0)], [(2, 0)]], with_logprobs=False)[0]
    decoder.decode(encoder.encode(first))
    encoder.forget("a")
    decoder.forget("a")
    again = decoder.decode(encoder.encode(first))  # the id reused: starts from scratch
    assert again == first
