"""compute_prompt_logprobs: each row's target logprob, rank and top-k, whatever the slice size."""
import torch

from folovllm.sample.prompt_logprobs import (
    PromptLogprobsBatch,
    PromptLogprobsRequest,
    compute_prompt_logprobs,
)


def test_rows_targets_ranks_and_topk_whatever_the_slicing() -> None:
    torch.manual_seed(0)
    hidden = torch.randn(9, 8)
    head = torch.randn(8, 30)
    batch = PromptLogprobsBatch(["a", "b"], [PromptLogprobsRequest(3, 1, [4, 5, 6]),
                                             PromptLogprobsRequest(0, 7, [1, 2])],
                                row_indices=[0, 1, 2, 5, 6], target_token_ids=[4, 5, 6, 1, 2])
    reference = torch.log_softmax(hidden @ head, dim=-1)
    results = [compute_prompt_logprobs(hidden, batch, lambda h: h @ head, slice_rows=n).to_host()
               for n in (1, 2, 512)]
    for sliced in results[:2]:  # a slice at a time gives what all rows at once give
        for a, b in zip(sliced, results[2]):
            assert [(e.token_id, e.rank) for e in a.entries] == [(e.token_id, e.rank) for e in b.entries]
            assert all(abs(x.logprob - y.logprob) < 1e-5 for x, y in zip(a.entries, b.entries))
    first, second = results[2]
    assert (first.request_id, first.first_position, second.first_position) == ("a", 1, 7)
    for chunk, rows in ((first, [0, 1, 2]), (second, [5, 6])):
        for entry, row in zip(chunk.entries, rows):
            target = entry.token_id
            assert abs(entry.logprob - float(reference[row, target])) < 1e-5
            assert entry.rank == int((reference[row] > reference[row, target]).sum()) + 1
            k = 3 if chunk is first else 0
            assert [t for t, _ in entry.top_logprobs] == reference[row].topk(k).indices.tolist()
