"""The generation endpoints: /v1/chat/completions and /v1/completions, answered
whole or streamed as server-sent events."""
from __future__ import annotations

from typing import Any, NamedTuple

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.common import API
from ggserve.server.api.delivery import Collected, collect, sse
from ggserve.server.api.errors import invalid
from ggserve.server.api.limits import check_messages
from ggserve.server.api.llama.lora import request_adapters
from ggserve.server.api.media_parts import load_media
from ggserve.server.chat.continued import Prefill
from ggserve.server.chat.options import ChatOptions, chat_options, compile_grammar_async, completion_options
from ggserve.server.chat.output import Format, shown_tokens
from ggserve.server.chat.prompts import Prompt
from ggserve.server.request_errors import RequestError
from ggserve.server.service.jobs import Delta, Job


def continuation(req: S.ChatCompletionRequest, msgs: list[dict]) -> tuple[bool, bool]:
    """(continue the final message, add the generation prompt), checked as llama-server 11434
    (server-common.cpp): a final assistant message is continued (prefill) unless told otherwise."""
    cont = req.continue_final_message in (True, "content", "reasoning_content")
    agp = req.add_generation_prompt
    if not cont and msgs[-1]["role"] == "assistant":
        if len(msgs) >= 2 and msgs[-2]["role"] == "assistant":
            raise invalid("Cannot have 2 or more assistant messages at the end of the list.", param="messages")
        cont, agp = True, False
    if cont and agp:
        raise invalid("Cannot set both add_generation_prompt and continue_final_message to true.",
                      param="continue_final_message")
    return cont, agp


def prefill(req: S.ChatCompletionRequest) -> Prefill:
    """The final assistant message a chat continues (empty: none): llama-server's parsed
    message starts with it, its text and its reasoning_content (server/chat/continued.py)."""
    last = req.messages[-1] if req.messages else None
    if last is None or last.role != "assistant" or req.continue_final_message == "reasoning_content":
        return Prefill()
    if isinstance(last.content, list):
        return Prefill("".join(p.text or "" for p in last.content if p.type == "text"), last.reasoning_content or "")
    return Prefill(last.content or "", last.reasoning_content or "")


def template_messages(req: S.ChatCompletionRequest) -> tuple[list[dict], list[tuple[str, str]]]:
    """A request's messages as the chat template takes them (an image or audio part as an
    `image_url` part without its url) and the media's (image url | input_audio dict, param) in order."""
    msgs, urls = [], []
    for i, m in enumerate(req.messages):
        msg: dict[str, Any] = {"role": m.role}
        if isinstance(m.content, list):
            parts = []
            for j, part in enumerate(m.content):
                if part.type == "text":
                    if part.text is None:
                        raise invalid("text content part needs `text`",
                                      param=f"messages.{i}.content")
                    parts.append({"type": "text", "text": part.text})
                elif part.type == "image_url":
                    url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
                    if not isinstance(url, str) or not url:
                        raise invalid("image_url part needs `image_url.url`",
                                      param=f"messages.{i}.content.{j}.image_url")
                    urls.append((url, f"messages.{i}.content.{j}.image_url"))
                    parts.append({"type": "image_url"})
                elif part.type == "input_audio":      # the same media marker; decoded by api/media_parts.py
                    urls.append((part.input_audio if isinstance(part.input_audio, dict) else {"data": None},
                                 f"messages.{i}.content.{j}.input_audio"))
                    parts.append({"type": "image_url"})
                else:
                    raise invalid(f"unsupported content part type {part.type!r}",
                                  param=f"messages.{i}.content")
            msg["content"] = parts
        else:
            msg["content"] = m.content
        if m.content is None and not m.tool_calls and m.role != "assistant":
            raise invalid(f"messages.{i}.content is required for role {m.role!r}",
                          param=f"messages.{i}.content")
        if msg["content"] is None:
            msg["content"] = ""
        for k in ("name", "tool_calls", "tool_call_id", "reasoning_content"):
            if getattr(m, k) is not None:
                msg[k] = getattr(m, k)
        msgs.append(msg)
    return msgs, urls


async def chat_prompt(api: API, req: S.ChatCompletionRequest, opts: ChatOptions):
    """Messages -> Prompt. Image parts are fetched/decoded (server/api/media.py) and
    become the media marker in the rendered template; the service's prompt
    builder arranges their embedding rows as llama.cpp's mtmd does."""
    msgs, urls = template_messages(req)
    api.engine                     # 503 while loading
    images = await load_media(api, urls)
    cont, agp = continuation(req, msgs)
    try:
        return await api.service.chat_prompt(
            opts.messages(msgs, getattr(api.engine, "chat_template", None)), opts.tools, images, template_kwargs=opts.template_kwargs,
            continue_final=cont, add_generation_prompt=agp)
    except RequestError:
        raise
    except ValueError as e:
        raise invalid(str(e), param="messages") from None

async def request_prompt(api: API, req: S.ChatCompletionRequest) -> Prompt:
    """The prompt a chat request would run, not run (/apply-template, token counts)."""
    opts = chat_options(req, api.cfg, getattr(api.engine, "chat_template", None))
    return await chat_prompt(api, req, opts)


async def chat_request(api: API, request: Request) -> S.ChatCompletionRequest:
    body = await api.json_body(request)
    check_messages(body, api.engine.n_ctx)      # before validating a 100,000-message body
    return S.ChatCompletionRequest.model_validate(body)


async def _unrun_prompt(api: API, request: Request) -> Prompt:
    return await request_prompt(api, await chat_request(api, request))


async def apply_template(api: API, request: Request) -> Response:
    """llama-server's /apply-template: a chat request's prompt text, not run."""
    return JSONResponse({"prompt": (await _unrun_prompt(api, request)).text})


async def chat_input_tokens(api: API, request: Request) -> Response:
    """llama-server's /chat/completions/input_tokens: a chat request's prompt tokens, counted."""
    return JSONResponse({"input_tokens": len((await _unrun_prompt(api, request)).tokens),
                         "object": "response.input_tokens"})


# what the chat and text answers share -----------------------------------------------

class Head(NamedTuple):
    """What every part of one answer repeats."""
    id: str
    model: str
    created: int


def new_head(prefix: str, api: API) -> Head:
    rid, created = S.new_id(prefix), S.now()
    return Head(rid, api.model_id(), created)


def job_usage(job: Job) -> dict:
    return S.usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)


def usage_chunk(head: Head, object_type: str, job: Job) -> dict:
    """A stream's last chunk with include_usage: the usage, and the timings as llama-server."""
    return {**S.usage_chunk(head.id, head.model, head.created, object_type, job_usage(job)),
            "timings": job.timings}


async def submit_chat(api: API, req: S.ChatCompletionRequest, *, salt: str) -> Job:
    """A chat request -> its queued Job: the one generation path that
    /v1/chat/completions, /v1/responses and /v1/messages share. salt: its cache salt
    (API.cache_salt)."""
    api.settle_fields(req)
    api.check_n(req.n)
    if req.n_probs and not req.logprobs:      # llama.cpp's spelling of top_logprobs
        req.logprobs, req.top_logprobs = True, req.n_probs
    opts = chat_options(req, api.cfg, getattr(api.engine, "chat_template", None))
    prompt = await chat_prompt(api, req, opts)
    opts.note_prompt(prompt.text, prefill(req))    # a forced call comes after reasoning the prompt opened
    grammar = await compile_grammar_async(api.grammars, opts, api.limits.grammar_timeout)
    n_probs = max(req.top_logprobs or 0, 1) if req.logprobs else 0
    params = api.sampling(req, n_probs, req.n)
    for p in params:
        p.grammar = grammar
    fmt = opts.syntax or Format()
    return await api.service.submit([prompt] * req.n, params, req.limit, n_keep=api.n_keep(req),
                                    ignore_eos=req.ignore_eos, stops=req.stop,
                                    output=opts.output(prompt.text, prefill(req)), id_slot=req.id_slot,
                                    progress=req.stream and req.return_progress, cache_salt=salt,
                                    adapters=request_adapters(api, req),
                                    show_tokens=shown_tokens(api.engine.tokenizer, fmt, tools=opts.fmt is not None))


async def chat(api: API, request: Request) -> Response:
    """POST /v1/chat/completions: the whole answer, or its chunks streamed."""
    req = await chat_request(api, request)
    job = await submit_chat(api, req, salt=api.cache_salt(request, req))
    head = new_head("chatcmpl", api)
    if not req.stream:
        got = await collect(request, job, req.n)
        return JSONResponse(chat_completion_object(api, req, job, head, got))
    return sse(job, chat_chunks(api, req, job, head))


def chat_logprobs(api: API, req: S.ChatCompletionRequest, entries) -> list[dict]:
    """A chat answer's `logprobs.content` entries, top_logprobs alternatives each."""
    k = req.top_logprobs or 0
    return [S.chat_logprob_entry(raw, lp, top[:k]) for raw, lp, top in api.logprob_tokens(entries)]


def chat_completion_object(api: API, req: S.ChatCompletionRequest, job: Job, head: Head, got: Collected) -> dict:
    """The whole chat.completion: each choice's message, usage and timings."""
    choices = []
    for i in range(req.n):
        calls = job.choices[i].output.calls if job.choices[i].output else []
        text = got.text(i)
        choices.append(S.chat_choice(i, None if calls and not text else text, got.finish[i],
                                     chat_logprobs(api, req, got.logprobs[i]) if req.logprobs else None,
                                     got.reasoning_text(i), calls))
    out = {**S.chat_completion(head.id, head.model, head.created, choices, job_usage(job)),
           "timings": job.timings}
    if req.verbose if req.verbose is not None else getattr(api.cfg, "verbose", False):
        out["__verbose"] = verbose_copy(api, job, got.text(0))
    return out


def verbose_copy(api: API, job: Job, content: str) -> dict:
    """llama-server's debug copy of the answer in its native shape (the prompt as its tokens read)."""
    return {"content": content, "prompt": api.engine.tokenizer.decode(job.prompts[0]),
            "tokens_predicted": job.choices[0].n_tokens, "tokens_evaluated": len(job.prompts[0]),
            "timings": job.timings}


async def chat_chunks(api: API, req: S.ChatCompletionRequest, job: Job, head: Head):
    """The chat.completion.chunk stream: each choice's role first, then each delta's chunks,
    the usage last when asked."""
    usage_on = req.include_usage

    def chunk(i: int, delta: dict, **fields) -> dict:
        return S.chat_chunk(head.id, head.model, head.created, i, delta, with_usage=usage_on, **fields)

    for i in range(req.n):
        yield chunk(i, {"role": "assistant", "content": None})   # as llama-server (OpenAI: "" or null)
    async for i, d in job:
        for c in delta_chunks(api, req, i, d, chunk):
            if req.timings_per_token:
                c["timings"] = job.timings
            yield c
    if usage_on:
        yield usage_chunk(head, "chat.completion.chunk", job)     # as llama-server


def delta_chunks(api: API, req: S.ChatCompletionRequest, i: int, d: Delta, chunk) -> list[dict]:
    """One delta of choice i as chunks: prompt progress, reasoning, content (and its logprobs),
    tool calls, the finish reason, in that order."""
    step = []
    if d.progress:
        step.append({**chunk(i, {"role": "assistant", "content": None}), "prompt_progress": d.progress})
    if d.reasoning:
        step.append(chunk(i, {"reasoning_content": d.reasoning}))
    if d.text or (req.logprobs and d.logprobs):
        step.append(chunk(i, {"content": d.text} if d.text else {},
                          logprobs=chat_logprobs(api, req, d.logprobs) if req.logprobs else None))
    if d.tool_calls:
        step.append(chunk(i, {"tool_calls": d.tool_calls}))
    if d.finish_reason:
        step.append(chunk(i, {}, finish=d.finish_reason))
    return step

# completions ------------------------------------------------------------------------

def completion_prompts(api: API, req: S.CompletionRequest) -> list[list[int]]:
    tok = api.engine.tokenizer
    p = req.prompt
    if isinstance(p, str):
        raw = [p]
    elif all(isinstance(x, int) for x in p):
        raw = [p]
    else:
        raw = p
    out = []
    for x in raw:
        if isinstance(x, str):
            out.append(tok.encode(x, add_special=True, parse_special=True))
        else:
            if not x:
                raise invalid("prompt must not be empty", param="prompt")
            if any(not 0 <= t < tok.n_vocab for t in x):
                raise invalid("prompt has a token id out of range", param="prompt")
            out.append(list(x))
    return out


async def completion_request(api: API, request: Request) -> S.CompletionRequest:
    req = S.CompletionRequest.model_validate(await api.json_body(request))
    api.settle_fields(req)
    api.check_n(req.n)
    if req.n_probs and req.logprobs is None:      # llama.cpp's spelling of logprobs
        req.logprobs = req.n_probs
    return req


async def completion_sampling(api: API, req, n_probs: int, n: int) -> list:
    """The sampling parameters of a prompt's n choices, each under the request's grammar
    (json_schema or grammar, else --grammar / --json-schema); /completion's too."""
    params = api.sampling(req, n_probs, n)
    grammar = await compile_grammar_async(api.grammars, completion_options(req, api.cfg), api.limits.grammar_timeout)
    for p in params:
        p.grammar = grammar
    return params


async def completions(api: API, request: Request) -> Response:
    """POST /v1/completions: each prompt answered n times, whole or streamed."""
    req = await completion_request(api, request)
    prompts = completion_prompts(api, req)
    if len(prompts) * req.n > api.cfg.n_parallel:
        raise invalid(f"prompts × n must be at most {api.cfg.n_parallel}", param="n")
    n_probs = max(req.logprobs or 0, 1) if req.logprobs is not None else 0
    params = await completion_sampling(api, req, n_probs, req.n)
    per_choice = [p for p in prompts for _ in range(req.n)]
    job = await api.service.submit([Prompt(p) for p in per_choice], params * len(prompts), req.limit,
                                    ignore_eos=req.ignore_eos, stops=req.stop, id_slot=req.id_slot,
                                    n_keep=api.n_keep(req), cache_salt=api.cache_salt(request, req),
                                    adapters=request_adapters(api, req))
    head = new_head("cmpl", api)
    echo = echoes(api, req, per_choice)
    if not req.stream:
        got = await collect(request, job, len(per_choice))
        return JSONResponse(text_completion_object(api, req, job, head, echo, got))
    return sse(job, completion_chunks(api, req, job, head, echo))


def echoes(api: API, req: S.CompletionRequest, per_choice: list[list[int]]) -> list[str]:
    """What each choice's text starts with: with `echo`, its prompt (as sent, when one string)."""
    tok = api.engine.tokenizer
    echo = [tok.decode(p) if req.echo else "" for p in per_choice]
    if req.echo and isinstance(req.prompt, str):
        echo = [req.prompt] * len(per_choice)
    return echo


def completion_logprobs(api: API, req: S.CompletionRequest, entries, offset: int) -> dict | None:
    """A choice's `logprobs` object from text offset `offset` on; None unless logprobs was asked."""
    if req.logprobs is None:
        return None
    k = req.logprobs or 0
    tokens = [(raw, lp, top[:k]) for raw, lp, top in api.logprob_tokens(entries)]
    return S.completion_logprobs(tokens, offset)


def text_completion_object(api: API, req: S.CompletionRequest, job: Job, head: Head, echo: list[str],
                           got: Collected) -> dict:
    """The whole text_completion: each choice's text after its echo, usage and timings."""
    choices = [S.completion_choice(i, echo[i] + got.text(i), got.finish[i],
                                   completion_logprobs(api, req, got.logprobs[i], len(echo[i])))
               for i in range(len(echo))]
    return {**S.completion(head.id, head.model, head.created, choices, job_usage(job)), "timings": job.timings}


async def completion_chunks(api: API, req: S.CompletionRequest, job: Job, head: Head, echo: list[str]):
    """The text_completion stream: the echoes first, a chunk per delta, the usage last when asked."""
    usage_on = req.include_usage

    def chunk(choice: dict) -> dict:
        return S.completion_chunk(head.id, head.model, head.created, choice, usage_on)

    offsets = [len(e) for e in echo]
    for i, e in enumerate(echo):
        if e:
            yield chunk(S.completion_choice(i, e, None, None))
    async for i, d in job:
        lp = completion_logprobs(api, req, d.logprobs, offsets[i])
        offsets[i] += len(d.text)
        yield chunk(S.completion_choice(i, d.text, d.finish_reason, lp))
    if usage_on:
        yield usage_chunk(head, "text_completion", job)
