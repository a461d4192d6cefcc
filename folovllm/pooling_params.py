"""Per-request settings of a pooling request (embed, encode, score), with vLLM's field names."""
from __future__ import annotations

from dataclasses import dataclass

POOLING_TASKS = ("embed", "encode", "score")


@dataclass
class PoolingParams:
    """How to turn one prompt's hidden states into its result.

    ``dimensions``: keep the first this many components (Matryoshka embeddings), before normalizing;
    ``normalize``: scale to unit L2 norm (None: the pooler config's default, on for embeddings);
    ``truncate_prompt_tokens``: keep the prompt's last this many tokens (-1: the model's maximum);
    ``task``: what the caller asked for (``embed`` by default; set by ``LLM.embed/encode/score``).
    """

    dimensions: int | None = None
    normalize: bool | None = None
    truncate_prompt_tokens: int | None = None
    task: str = "embed"

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions must be a positive integer; got {self.dimensions!r}")
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize must be true or false; got {self.normalize!r}")
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}; got {self.task!r}")
        limit = self.truncate_prompt_tokens
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit == 0 or limit < -1):
            raise ValueError(f"truncate_prompt_tokens must be >= 1, or -1 for the model's maximum; got {limit!r}")
