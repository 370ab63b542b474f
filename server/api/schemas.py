"""Request models (pydantic v2) and builders for OpenAI's response shapes.

Requests: unknown fields are ignored; wrong types and out-of-range values fail
validation (strict types: a string is not a number, 0 is not a bool), which the
app turns into a 400.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]

# llama-server sends b<build>-<commit>; ours names the llama.cpp build whose answers ggserve reproduces
FINGERPRINT = "b11434-ggserve"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Model):
    include_usage: bool = False


class ContentPart(_Model):
    type: str
    text: Optional[str] = None
    image_url: Any = None
    input_audio: Any = None          # {data: base64, format: wav | mp3 | flac}


class Message(_Model):
    role: Role
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None
    tool_call_id: Optional[str] = None
    reasoning_content: Optional[str] = None


class _Sampling(_Model):
    """Fields shared by chat and text completions."""

    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=-1)
    temperature: Optional[float] = Field(None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    typical_p: Optional[float] = Field(None, ge=0.0, le=1.0)
    presence_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(None, ge=-2.0, le=2.0)
    repeat_penalty: Optional[float] = Field(None, ge=0.0)
    repeat_last_n: Optional[int] = Field(None, ge=-1)
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: int = Field(1, ge=1)
    # OpenAI's {"id": bias}, or llama.cpp's [[id, bias]] (bias false: never)
    logit_bias: Union[dict[str, float], list[list[Union[int, float, bool]]], None] = None
    ignore_eos: bool = False
    n_keep: int = Field(0, ge=-1)       # llama-server's: what a context shift keeps of the prompt (-1: all)
    user: Optional[str] = None
    stream: bool = False
    return_progress: bool = False       # llama-server's: a stream reports prompt processing (prompt_progress)
    timings_per_token: bool = False     # llama-server's: every streamed frame carries `timings`
    stream_options: Optional[StreamOptions] = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v):
        if v is not None and v == 0:
            raise ValueError("must be at least 1 (or -1 for no limit)")
        return v

    @field_validator("stop")
    @classmethod
    def _stop(cls, v):
        if isinstance(v, list) and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return [v] if isinstance(v, str) else v

    # llama.cpp's request fields: taken when they work here, refused when not
    n_predict: Optional[int] = Field(None, ge=-1)
    cache_prompt: bool = True
    # vLLM's: cached prefixes are shared only among requests with the same salt (server/api/owners.py)
    cache_salt: Optional[str] = None
    id_slot: int = -1
    lora: Any = None                    # llama-server's [{id, scale}]: this request's LoRA adapters (api/llama/lora.py)
    n_probs: Optional[int] = Field(None, ge=0, le=20)
    samplers: Optional[list[str]] = None
    dry_multiplier: float = 0.0
    xtc_probability: float = 0.0
    mirostat: int = 0
    grammar: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = None

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v):
        if v is not None and not v:       # as vLLM: a salt is meant to be secret, and "" is none
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, v):
        if isinstance(v, list):       # [[id, bias]]; a bias of false bans the token
            pairs = {}
            for pair in v:
                if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], int)
                        and not isinstance(pair[0], bool)):
                    raise ValueError("the list form is [[token_id, bias], ...]")
                bias = pair[1]
                pairs[str(pair[0])] = -100.0 if bias is False else float(bias)
            v = pairs
        if v is None:
            return v
        if not isinstance(v, dict):
            raise ValueError("must be an object of token id -> bias, or [[id, bias], ...]")
        for key, bias in v.items():
            if isinstance(bias, bool) or not isinstance(bias, (int, float)):
                raise ValueError(f"bias for token {key} must be a number")
            if not (key.isascii() and key.isdigit()):     # "１" is a digit to str.isdigit
                raise ValueError(f"keys must be token ids, got {key!r}")
            if not -100.0 <= bias <= 100.0:
                raise ValueError(f"bias for token {key} must be in [-100, 100]")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> str | None:
        """A llama.cpp field set to something this server does not do, by name."""
        if self.samplers is not None:
            return "samplers"
        if self.dry_multiplier:
            return "dry_multiplier"
        if self.xtc_probability:
            return "xtc_probability"
        if self.mirostat:
            return "mirostat"
        return None


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(..., min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Union[Literal["none", "auto", "required"], dict[str, Any], None] = None
    parallel_tool_calls: bool = False          # llama-server's default
    response_format: Optional[dict[str, Any]] = None
    chat_template_kwargs: Optional[dict[str, Any]] = None
    reasoning_format: Optional[Literal["none", "deepseek", "auto"]] = None
    add_generation_prompt: bool = True                         # llama-server's
    verbose: Optional[bool] = None             # llama-server's __verbose debug field (default: --verbose)
    continue_final_message: Union[bool, str, None] = None      # true, "content", "reasoning_content"

    @property
    def limit(self) -> Optional[int]:
        return self.max_completion_tokens or self.max_tokens or self.n_predict


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int], list[list[int]]]
    logprobs: Optional[int] = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: Optional[str] = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        if isinstance(v, list) and not v:
            raise ValueError("must not be empty")
        return v

    @property
    def limit(self) -> Optional[int]:
        if self.max_tokens is not None:
            return self.max_tokens
        return self.n_predict if self.n_predict is not None else 16


class TokenizeRequest(_Model):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Model):
    tokens: list[int]


# -- responses ---------------------------------------------------------------

def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt: int, completion: int, cached: int) -> dict:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def token_text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def chat_logprob_entry(raw: bytes, logprob: float, top: list[tuple[bytes, float]]) -> dict:
    """One element of `choices[].logprobs.content` in a chat completion."""
    return {
        "token": token_text(raw),
        "logprob": logprob,
        "bytes": list(raw),
        "top_logprobs": [
            {"token": token_text(b), "logprob": lp, "bytes": list(b)} for b, lp in top
        ],
    }


def chat_completion(id: str, model: str, created: int, choices: list[dict],
                    use: dict) -> dict:
    return {
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT, "choices": choices, "usage": use,
    }


def chat_choice(index: int, text: str | None, finish: str, logprobs: list[dict] | None,
                reasoning: str = "", tool_calls: list[dict] | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "index": index,
        "message": message,
        "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
        "finish_reason": finish,
    }


def chat_chunk(id: str, model: str, created: int, index: int, delta: dict,
               finish: str | None = None, logprobs: list[dict] | None = None,
               with_usage: bool = False) -> dict:
    chunk = {
        "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
        "system_fingerprint": FINGERPRINT,
        "choices": [{
            "index": index, "delta": delta,
            "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None},
            "finish_reason": finish,
        }],
    }
    if with_usage:
        chunk["usage"] = None
    return chunk


def usage_chunk(id: str, model: str, created: int, object: str, use: dict) -> dict:
    return {"id": id, "object": object, "created": created, "model": model,
            "system_fingerprint": FINGERPRINT, "choices": [], "usage": use}


def completion_logprobs(entries: list[tuple[bytes, float, list[tuple[bytes, float]]]],
                        offset: int = 0) -> dict:
    """The legacy `logprobs` object of /v1/completions."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for raw, lp, top in entries:
        text = token_text(raw)
        tokens.append(text)
        lps.append(lp)
        tops.append({token_text(b): v for b, v in top})
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops,
            "text_offset": offsets}


def completion(id: str, model: str, created: int, choices: list[dict], use: dict) -> dict:
    return {"id": id, "object": "text_completion", "created": created, "model": model,
            "system_fingerprint": FINGERPRINT, "choices": choices, "usage": use}


def completion_choice(index: int, text: str, finish: str | None,
                      logprobs: dict | None) -> dict:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}


def completion_chunk(id: str, model: str, created: int, choice: dict,
                     with_usage: bool = False) -> dict:
    chunk = {"id": id, "object": "text_completion", "created": created, "model": model,
             "system_fingerprint": FINGERPRINT, "choices": [choice]}
    if with_usage:
        chunk["usage"] = None
    return chunk
