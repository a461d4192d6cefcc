"""The engine's side of pooling requests: the model's pooling, which parameters an engine takes, and a
request's pooling row."""
from __future__ import annotations

from folovllm.model.layers.score_head import SEQUENCE_CLASSIFICATION
from folovllm.pooling.config import PoolerConfig, pooler_config_for
from folovllm.pooling.pooler import PoolingRow
from folovllm.pooling_params import PoolingParams
from folovllm.sampling_params import SamplingParams

RequestParams = SamplingParams | PoolingParams


def model_pooling(runner: str, given: dict | None, model_path: str,
                  architecture: str) -> tuple[PoolerConfig | None, bool]:
    """The engine's pooling (None: it generates) and whether the model is a cross-encoder (a
    ``*ForSequenceClassification`` checkpoint: it scores text pairs through its head)."""
    cross_encoder = architecture.endswith(SEQUENCE_CLASSIFICATION)
    if runner != "pooling":
        if cross_encoder:
            raise ValueError(f"{architecture} is a cross-encoder (a score head, no text generation): "
                             "run it with runner='pooling' (--runner pooling)")
        return None, False
    pooler = pooler_config_for(given, model_path)
    if cross_encoder:
        if pooler.pooling_type != "LAST":
            raise ValueError(f"{architecture} scores a text pair from its last token: pooling_type must be LAST")
        pooler = PoolerConfig("LAST", normalize=False)
    return pooler, cross_encoder


def pooling_request(params: RequestParams, pooler: PoolerConfig | None, hidden_size: int,
                    cross_encoder: bool = False) -> tuple[PoolingRow | None, SamplingParams]:
    """A request's pooling row (None: it generates) and the sampling settings its ``Request`` holds
    (a pooling request's: prefill only, nothing detokenized). ValueError when the parameters do not fit
    the engine: generation on a pooling model, pooling on a generative one."""
    if isinstance(params, SamplingParams):
        if pooler is not None:
            raise ValueError("this engine runs a pooling model (runner='pooling'): it does not generate text; "
                             "use embed, score or encode (/v1/embeddings, /score, /rerank, /pooling)")
        return None, params
    if not isinstance(params, PoolingParams):
        raise ValueError(f"request parameters must be SamplingParams or PoolingParams; got {type(params).__name__}")
    if pooler is None:
        raise ValueError("this engine runs a generative model: embed, score and encode need "
                         "runner='pooling' (folovllm serve MODEL --runner pooling)")
    if cross_encoder and (params.task != "score" or params.dimensions is not None):
        raise ValueError("this model is a cross-encoder: it scores text pairs (score, /score, /rerank) and "
                         "gives no embeddings (nor dimensions)")
    if params.dimensions is not None and params.dimensions > hidden_size:
        raise ValueError(f"dimensions={params.dimensions} is more than the model's hidden size {hidden_size}")
    if params.task == "embed" and pooler.pooling_type == "ALL":
        raise ValueError("pooling type ALL gives one vector per token, not an embedding: use encode "
                         "(or /pooling), or another pooling_type in --pooler-config")
    normalize = pooler.normalize if params.normalize is None or cross_encoder else params.normalize
    row = PoolingRow(pooler.pooling_type, normalize, params.dimensions)
    return row, SamplingParams(max_tokens=1, detokenize=False, output_kind="final_only",
                               truncate_prompt_tokens=params.truncate_prompt_tokens)
