from folovllm.spec_decode.ngram import propose_ngram


def test_the_latest_earlier_occurrence_of_the_longest_suffix_wins():
    tokens = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3]
    assert propose_ngram(tokens, 2, 1, 3) == [4, 5]  # "2 3" last seen before 4 5
    assert propose_ngram([5, 1, 2, 3, 6, 2, 3, 7, 1, 2, 3], 3, 1, 3) == [6, 2, 3]  # "1 2 3" beats "2 3"


def test_no_match_no_proposal():
    assert propose_ngram([1, 2, 3, 4], 3, 1, 2) == []
    assert propose_ngram([1, 2], 3, 2, 2) == []
    assert propose_ngram([1, 2, 1, 2], 0, 1, 2) == []


def test_proposals_stop_at_the_end_of_the_sequence():
    assert propose_ngram([7, 7, 7], 4, 1, 1) == [7]
