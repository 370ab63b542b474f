"""llama-server's native completion endpoints, /completion and /completions (and
/infill's answer, server/api/llama/infill.py): its request fields (`prompt` as text, token ids,
a mixed list or several prompts, `n_predict`, `n_probs`, `return_tokens`) and its
answer (`content`, `stop_type`, `stopping_word`, `generation_settings`, `timings`,
`completion_probabilities`, ...); streamed as `data: {...}` frames with no [DONE],
the last one the whole answer with empty `content`."""
from __future__ import annotations

import math
from typing import Any, Optional, Union

from pydantic import Field, field_validator
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.common import API
from ggserve.server.api.delivery import Collected, collect, sse
from ggserve.server.api.errors import invalid
from ggserve.server.api.llama.lora import request_adapters
from ggserve.server.api.llama.media_prompt import is_media_prompt, media_prompt
from ggserve.server.api.openai.generation import completion_sampling
from ggserve.server.chat.prompts import Prompt
from ggserve.server.service.jobs import Delta, Job

# llama-server's sampler chain and the defaults of the samplers this server refuses to
# change (server/api/schemas.py unsupported()), so `generation_settings` reads as its own.
_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]
_RANDOM_SEED = 4294967295         # LLAMA_DEFAULT_SEED: "pick one at random"


class NativeCompletionRequest(S._Sampling):
    prompt: Union[str, list[Any], dict[str, Any]]
    return_tokens: bool = False
    n_cmpl: Optional[int] = Field(None, ge=1)     # llama-server's name for n
    post_sampling_probs: bool = False
    n_keep: int = 0
    n_indent: int = 0
    t_max_predict_ms: int = 0
    min_keep: int = 0
    response_fields: Optional[list[str]] = None
    # /infill's own fields (server/api/llama/infill.py)
    input_prefix: Optional[str] = None
    input_suffix: Optional[str] = None
    input_extra: Optional[list[dict[str, Any]]] = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, v):
        if v is None:
            raise ValueError("`prompt` is required")
        return v

    @property
    def limit(self) -> Optional[int]:
        n = self.n_predict if self.n_predict is not None else self.max_tokens
        return None if n is None or n < 0 else n       # llama-server's -1: until EOS or context end

    @property
    def n_choices(self) -> int:
        return self.n_cmpl or self.n

    def refused(self) -> Optional[str]:
        if self.n_indent:
            return "n_indent"
        if self.t_max_predict_ms:
            return "t_max_predict_ms"
        return None


def _is_id(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def split_prompts(prompt) -> list:
    """llama-server's tokenize_input_prompts: a string, a list of ids, or a list mixing ids and
    strings is one prompt; any other list is one prompt per element."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, dict):
        prompt = [prompt]
    if prompt and all(_is_id(x) or isinstance(x, str) for x in prompt) and any(_is_id(x) for x in prompt):
        return [prompt]
    if not prompt:
        raise invalid("prompt must not be empty", param="prompt")
    return list(prompt)


def tokenize_mixed(tok, p) -> list[int]:
    """One prompt -> ids, as llama-server's tokenize_mixed: only a leading string gets BOS.
    {"prompt_string": ...} stands for its prompt_string (llama-server's JSON prompt)."""
    if isinstance(p, dict):
        if "multimodal_data" in p:
            raise invalid("multimodal_data prompts are not supported by /completion here; send images "
                          "to /v1/chat/completions", param="prompt")
        if "prompt_string" not in p:
            raise invalid("a JSON prompt needs a prompt_string", param="prompt")
        p = p["prompt_string"]
    parts = [p] if isinstance(p, str) else p
    if not isinstance(parts, list):
        raise invalid("each prompt must be a string, a list of token ids, or a list mixing both",
                      param="prompt")
    ids: list[int] = []
    for i, x in enumerate(parts):
        if isinstance(x, str):
            ids += tok.encode(x, add_special=i == 0, parse_special=True)
        elif _is_id(x):
            if not 0 <= x < tok.n_vocab:
                raise invalid(f"prompt has a token id out of range: {x}", param="prompt")
            ids.append(x)
        else:
            raise invalid("each prompt must be a string, a list of token ids, or a list mixing both",
                          param="prompt")
    return ids


def generation_settings(api: API, req: NativeCompletionRequest, p) -> dict:
    """llama-server's `generation_settings`: the sampling this answer ran with."""
    return {
        "seed": p.seed if p.seed is not None else _RANDOM_SEED,      # the request's, else --seed's
        "temperature": p.temperature, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
        "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p, "top_n_sigma": -1.0,
        "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": p.typical_p,
        "repeat_last_n": p.repeat_last_n, "repeat_penalty": p.repeat_penalty,
        "presence_penalty": p.presence_penalty, "frequency_penalty": p.frequency_penalty,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
        "dry_sequence_breakers": ["\n", ":", "\"", "*"],
        "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9,
        "stop": req.stop or [], "max_tokens": req.limit if req.limit is not None else api.cfg.n_predict,
        "n_predict": req.limit if req.limit is not None else api.cfg.n_predict,      # else -n's
        "n_keep": api.n_keep(req), "n_discard": 0,
        "ignore_eos": req.ignore_eos, "stream": req.stream,
        # llama-server's {bias, token}; a ban (-inf) prints as null, as its JSON library writes it
        "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in p.logit_bias.items()],
        "n_probs": req.n_probs or 0, "min_keep": req.min_keep,
        "grammar": req.grammar or "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
        "chat_format": "Content-only", "reasoning_format": api.cfg.reasoning_format,
        "reasoning_in_content": False, "generation_prompt": "", "samplers": list(_SAMPLERS),
        "speculative.types": "none", "timings_per_token": req.timings_per_token,
        "post_sampling_probs": req.post_sampling_probs, "backend_sampling": False, "lora": [],
    }


def probs(api: API, entries, k: int, post: bool = False) -> list[dict]:
    """`completion_probabilities` of the tokens behind a piece of text; post (post_sampling_probs):
    probabilities after the sampler chain, as `prob` / `top_probs` (the sampler keeps them as logs)."""
    def one(t, raw, lp):
        return {"id": t, "token": S.token_text(raw), "bytes": list(raw),
                **({"prob": math.exp(lp)} if post else {"logprob": lp})}

    top_key = "top_probs" if post else "top_logprobs"
    return [{**one(t, raw, lp), top_key: [one(u, r, v) for (u, v), (r, _) in zip(top[:k], top_raw)]}
            for (t, lp, top), (raw, _, top_raw) in zip(entries, api.logprob_tokens(entries))]


def stop_type(job: Job, i: int, finish: str | None) -> tuple[str, str]:
    c = job.choices[i]
    if c.stops.stopped:
        return "word", c.stops.matched or ""
    if finish == "length":
        return "limit", ""
    return ("eos", "") if finish else ("none", "")


async def submit(api: API, req: NativeCompletionRequest, prompts: list[list[int]], salt: str) -> tuple[Job, list]:
    """The job, and the sampling parameters of a prompt's n_choices answers (salt: API.cache_salt)."""
    api.settle_fields(req)
    bad = req.refused()
    if bad:
        raise invalid(f"{bad} is not supported by this server", param=bad)
    n = req.n_choices
    api.check_n(n)
    params = await completion_sampling(api, req, req.n_probs or 0, n)      # choice j of a prompt: seed + j
    job = await api.service.submit([p if isinstance(p, Prompt) else Prompt(p) for p in prompts],
                                   params * (len(prompts) // n), req.limit,
                                   n_keep=api.n_keep(req),
                                   ignore_eos=req.ignore_eos, stops=req.stop, id_slot=req.id_slot,
                                   progress=req.stream and req.return_progress, cache_salt=salt,
                                   adapters=request_adapters(api, req))
    return job, params


async def answer(api: API, request: Request, req: NativeCompletionRequest,
                 prompts: list[list[int]]) -> Response:
    """Run the prompts, n_cmpl (n) times each; answer in llama-server's native shape (a list
    for several answers, prompt by prompt, `index` running over all)."""
    prompts = [p for p in prompts for _ in range(req.n_choices)]
    job, choice_params = await submit(api, req, prompts, api.cache_salt(request, req))
    native = NativeAnswer(api, req, job, prompts, choice_params)
    if not req.stream:
        return JSONResponse(native.whole(await collect(request, job, len(prompts))))
    return sse(job, native.frames(), end="")


class NativeAnswer:
    """One job's answer in llama-server's shape: what each of its objects repeats, and how
    each is made, whole or streamed."""

    def __init__(self, api: API, req: NativeCompletionRequest, job: Job, prompts: list[list[int]],
                 choice_params: list):
        self.api, self.req, self.job, self.prompts = api, req, job, prompts
        self.tok = api.engine.tokenizer
        self.k = req.n_probs or 0
        self.model = api.cfg.alias or api.cfg.model
        self.settings = [generation_settings(api, req, p) for p in choice_params]      # seeds differ

    def final(self, i: int, content: str, text: str, ids: list[int], lps: list, finish) -> dict:
        """Choice i's last object (`text`: all it generated)."""
        req, c = self.req, self.job.choices[i]
        prompt_ids = self.prompts[i].tokens if isinstance(self.prompts[i], Prompt) else self.prompts[i]
        n_prompt = c.n_prompt or len(prompt_ids)
        kind, word = stop_type(self.job, i, finish)
        out = {"index": i, "content": content, "tokens": ids, "id_slot": 0, "stop": True,
               "model": self.model, "tokens_predicted": c.n_tokens, "tokens_evaluated": n_prompt,
               "generation_settings": self.settings[i % req.n_choices],
               "prompt": self.tok.decode([t for t in prompt_ids if t >= 0]),      # media rows: placeholders
               "has_new_line": "\n" in text, "truncated": False,
               "stop_type": kind, "stopping_word": word,
               "tokens_cached": n_prompt + max(c.n_tokens - 1, 0),
               "timings": self.job.choice_timings(i)}
        if self.k and not req.stream:          # a stream sent them with each token
            out["completion_probabilities"] = probs(self.api, lps, self.k, req.post_sampling_probs)
        return out

    def whole(self, got: Collected) -> dict | list[dict]:
        """The whole answer: one object, or a list of them for several."""
        outs = []
        for i in range(len(self.prompts)):
            ids = [t for t, _, _ in got.logprobs[i]]         # the EOS token last, as llama-server
            text = got.text(i)
            outs.append(self.final(i, text, text, ids if self.req.return_tokens else [], got.logprobs[i],
                                   got.finish[i]))
        if self.req.response_fields:
            outs = [response_fields(o, self.req.response_fields) for o in outs]
        return outs[0] if len(outs) == 1 else outs

    async def frames(self):
        """The stream: progress and token frames as they come, each choice's final object last."""
        texts: list[list[str]] = [[] for _ in self.prompts]
        async for i, d in self.job:
            texts[i].append(d.text)
            if d.progress:
                yield self.progress_frame(i, d)
            if d.text or d.logprobs:
                yield self.token_frame(i, d)
            if d.eog is not None:           # llama-server sends the EOS token in a frame of its own
                yield self.token_frame(i, Delta(logprobs=[d.eog]))
            if d.finish_reason:
                yield self.final(i, "", "".join(texts[i]), [], [], d.finish_reason)

    def progress_frame(self, i: int, d: Delta) -> dict:
        chunk = {"index": i, "content": "", "tokens": [], "stop": False, "id_slot": -1,
                 "tokens_predicted": 0, "tokens_evaluated": self.job.choices[i].n_prompt,
                 "prompt_progress": d.progress}
        if self.req.timings_per_token:
            chunk["timings"] = progress_timings(self.job.choice_timings(i), d.progress)
        return chunk

    def token_frame(self, i: int, d: Delta) -> dict:
        c = self.job.choices[i]
        chunk = {"index": i, "content": d.text, "tokens": [t for t, _, _ in d.logprobs],
                 "stop": False, "id_slot": -1, "tokens_predicted": c.n_tokens,
                 "tokens_evaluated": c.n_prompt or len(getattr(self.prompts[i], "tokens", self.prompts[i]))}
        if self.req.timings_per_token:
            chunk["timings"] = self.job.choice_timings(i)
        if self.k:
            chunk["completion_probabilities"] = probs(self.api, d.logprobs, self.k, self.req.post_sampling_probs)
        return chunk


def text_logit_bias(tok, body: dict) -> dict:
    """llama-server's logit_bias may name tokens by text ([["hello", -1]] or {"hello": -1}):
    each token of the text gets the bias. -> the same body with token ids only."""
    lb = body.get("logit_bias")
    if isinstance(lb, dict):
        pairs = list(lb.items())
    elif isinstance(lb, list) and all(isinstance(p, list) and len(p) == 2 for p in lb):
        pairs = [tuple(p) for p in lb]
    else:
        return body
    if not any(isinstance(k, str) and not k.isdigit() for k, _ in pairs):
        return body
    out = {}
    for key, bias in pairs:
        bias = -100.0 if bias is False else bias          # false: never (llama-server)
        ids = [int(key)] if isinstance(key, int) or key.isdigit() else \
            tok.encode(key, add_special=False, parse_special=False)
        out.update({str(t): bias for t in ids})
    return {**body, "logit_bias": out}


def response_fields(out: dict, fields: list[str]) -> dict:
    """llama-server's `response_fields`: only these fields, a/b naming b inside a."""
    picked = {}
    for path in fields:
        cur, ok = out, True
        for key in path.split("/"):
            if isinstance(cur, dict) and key in cur:
                cur = cur[key]
            else:
                ok = False
                break
        if ok:
            picked[path] = cur
    return picked


async def completion(api: API, request: Request) -> Response:
    """POST /completion, /completions: llama-server's native completion."""
    req = NativeCompletionRequest.model_validate(text_logit_bias(api.engine.tokenizer, await api.json_body(request)))
    tok = api.engine.tokenizer
    prompts = [await media_prompt(api, p) if is_media_prompt(p) else tokenize_mixed(tok, p)
               for p in split_prompts(req.prompt)]
    return await answer(api, request, req, prompts)


def progress_timings(timings: dict, progress: dict) -> dict:
    """timings_per_token's `timings` of a prompt_progress frame: the prompt so far (processed
    less cached tokens, and the time since the prompt started), nothing generated yet."""
    n, ms = progress["processed"] - progress["cache"], float(progress["time_ms"])
    return {**timings, "prompt_n": n, "prompt_ms": ms, "prompt_per_token_ms": ms / n if n else 0.0,
            "prompt_per_second": n * 1000 / ms if ms else 0.0}
