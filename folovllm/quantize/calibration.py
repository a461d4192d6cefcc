"""Calibration and held-out text, and calibration samples (token windows) drawn from it.

Without a file, the text is Python's own documentation topics (``pydoc_data.topics``, always
installed), split by topic: in sorted order, a topic is held out for evaluation while the held-out
part is under a fifth of the text so far, so about a fifth of the characters never calibrate.
"""
from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

HELD_OUT_SHARE = 0.2


def _pydoc_topics(held_out: bool) -> str:
    from pydoc_data.topics import topics

    parts: dict[bool, list[str]] = {True: [], False: []}
    held = total = 0
    for key in sorted(topics):
        hold = held < total * HELD_OUT_SHARE
        parts[hold].append(topics[key])
        held += len(topics[key]) if hold else 0
        total += len(topics[key])
    return "\n\n".join(parts[held_out])


def calibration_text(calib_file: str | None = None) -> str:
    """The text of ``calib_file``, or the calibration part of Python's documentation topics."""
    if calib_file is None:
        return _pydoc_topics(held_out=False)
    try:
        with open(calib_file, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read calibration file {calib_file!r}: {e}") from e


def held_out_text() -> str:
    """The documentation topics that calibration never sees (for measuring perplexity)."""
    return _pydoc_topics(held_out=True)


def calibration_samples(
    tokenizer: PreTrainedTokenizerBase, text: str, num_samples: int, seq_len: int, vocab_size: int, seed: int = 0
) -> torch.Tensor:
    """``num_samples`` windows of ``seq_len`` consecutive tokens at seeded random offsets: [N, L] int64."""
    if num_samples <= 0 or seq_len <= 0:
        raise ValueError(f"need a positive number of samples and sequence length, got {num_samples} x {seq_len}")
    ids = torch.tensor(tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"], dtype=torch.int64)
    if len(ids) < seq_len:
        raise ValueError(f"the calibration text has {len(ids)} tokens, fewer than --seq-len {seq_len}")
    if int(ids.max()) >= vocab_size:
        raise ValueError(f"the tokenizer produces id {int(ids.max())} but the model's vocabulary has "
                         f"{vocab_size} entries: the model folder needs its own tokenizer files")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(ids) - seq_len + 1, (num_samples,), generator=gen)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])
