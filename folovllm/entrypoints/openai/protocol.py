"""Request bodies of the OpenAI API (plus vLLM's sampling extras), as pydantic models.

Ranges are checked once, by SamplingParams, so the messages match the offline API's.
Responses are built as plain dicts in the serving modules (cheaper per streamed chunk).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from folovllm.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False


class _SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    priority: int = 0  # lower is served first under --scheduling-policy priority (vLLM's field)
    user: str | None = None  # the tenant, for --scheduling-policy fair (OpenAI's field)
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # vLLM extras
    top_k: int | None = None  # 0 or -1: disabled
    min_p: float = 0.0
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def to_sampling_params(self, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """Raises ValueError naming the parameter and its range (from SamplingParams)."""
        top_k = -1 if self.top_k in (None, 0) else self.top_k
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=top_k, min_p=self.min_p,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, max_tokens=max_tokens,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, logprobs=logprobs,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output)


class CompletionRequest(_SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_call_id, ... go to the template as given

    role: str
    content: str | list[ContentPart] | None = None

    def to_template_dict(self) -> dict:
        message = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):  # text parts only: this server has no vision models
            message["content"] = "".join(p.text or "" for p in self.content if p.type == "text")
        return message


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None


class TokenizeRequest(BaseModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[int]
