"""The generation endpoints: /v1/chat/completions and /v1/completions, answered
whole or streamed as server-sent events."""
from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ggserve.server.api import schemas as S
from ggserve.server.api.common import API
from ggserve.server.api.errors import APIError, invalid, to_api_error
from ggserve.server.api.limits import TimedStreamingResponse, check_messages
from ggserve.server.api.media import MediaError, load_image
from ggserve.server.chat.options import ChatOptions, chat_options, compile_grammar, completion_options
from ggserve.server.chat.output import Format, shown_tokens
from ggserve.server.chat.prompts import Prompt
from ggserve.server.request_errors import RequestError
from ggserve.server.service.jobs import Job


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


async def chat_prompt(api: API, req: S.ChatCompletionRequest, opts: ChatOptions):
    """Messages -> Prompt. Image parts are fetched/decoded (server/api/media.py) and
    become the media marker in the rendered template; the service's prompt
    builder arranges their embedding rows as llama.cpp's mtmd does."""
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
    api.engine                     # 503 while loading
    api.service.prompts.check_images(len(urls))
    images = []
    for url, param in urls:
        try:
            loaded = await load_image(url, api.media)
        except MediaError as e:
            raise e.api_error(param) from None
        images.append((loaded.sha256, loaded.image))
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
    opts = chat_options(req, api.cfg, getattr(api.engine.chat_template, "source", ""))
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


async def submit_chat(api: API, req: S.ChatCompletionRequest) -> Job:
    """A chat request -> its queued Job: the one generation path that
    /v1/chat/completions, /v1/responses and /v1/messages share."""
    api.settle_fields(req)
    api.check_n(req.n)
    if req.n_probs and not req.logprobs:      # llama.cpp's spelling of top_logprobs
        req.logprobs, req.top_logprobs = True, req.n_probs
    opts = chat_options(req, api.cfg, getattr(api.engine.chat_template, "source", ""))
    grammar = await api.service.on_prompt_thread(compile_grammar, api.grammars, opts)
    prompt = await chat_prompt(api, req, opts)
    n_probs = max(req.top_logprobs or 0, 1) if req.logprobs else 0
    params = api.sampling(req, n_probs, req.n)
    for p in params:
        p.grammar = grammar
    fmt = opts.syntax or Format()
    return await api.service.submit([prompt] * req.n, params, req.limit, n_keep=api.n_keep(req),
                                    ignore_eos=req.ignore_eos, stops=req.stop,
                                    output=opts.output(prompt.text), id_slot=req.id_slot,
                                    progress=req.stream and req.return_progress,
                                    show_tokens=shown_tokens(api.engine.tokenizer, fmt, tools=opts.fmt is not None))


async def chat(api: API, request: Request) -> Response:
    req = await chat_request(api, request)
    job = await submit_chat(api, req)
    k = req.top_logprobs or 0
    rid, created, model = S.new_id("chatcmpl"), S.now(), api.model_id()

    def lp_entries(entries):
        return [S.chat_logprob_entry(raw, lp, top[:k])
                for raw, lp, top in api.logprob_tokens(entries)]

    if not req.stream:
        texts = [[] for _ in range(req.n)]
        reasoning = [[] for _ in range(req.n)]
        lps = [[] for _ in range(req.n)]
        finish = [None] * req.n

        async def collect():
            async for i, d in job:
                texts[i].append(d.text)
                reasoning[i].append(d.reasoning)
                if req.logprobs:
                    lps[i].extend(lp_entries(d.logprobs))
                if d.finish_reason:
                    finish[i] = d.finish_reason

        await unless_disconnected(request, job, collect())
        choices = []
        for i in range(req.n):
            calls = job.choices[i].output.calls if job.choices[i].output else []
            text = "".join(texts[i])
            choices.append(S.chat_choice(i, None if calls and not text else text, finish[i],
                                         lps[i] if req.logprobs else None,
                                         "".join(reasoning[i]), calls))
        out = {**S.chat_completion(rid, model, created, choices,
                                   S.usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)),
               "timings": job.timings}
        if req.verbose if req.verbose is not None else getattr(api.cfg, "verbose", False):
            # llama-server's debug copy of the answer in its native shape (the prompt as its tokens read)
            out["__verbose"] = {"content": "".join(texts[0]), "prompt": api.engine.tokenizer.decode(job.prompts[0]),
                                "tokens_predicted": job.choices[0].n_tokens, "tokens_evaluated": len(job.prompts[0]),
                                "timings": job.timings}
        return JSONResponse(out)

    usage_on = req.include_usage

    async def events():
        for i in range(req.n):
            yield S.chat_chunk(rid, model, created, i,
                               {"role": "assistant", "content": None},   # as llama-server (OpenAI: "" or null)
                               with_usage=usage_on)
        async for i, d in job:
            step = []
            if d.progress:
                step.append({**S.chat_chunk(rid, model, created, i, {"role": "assistant", "content": None},
                                            with_usage=usage_on), "prompt_progress": d.progress})
            if d.reasoning:
                step.append(S.chat_chunk(rid, model, created, i, {"reasoning_content": d.reasoning},
                                         with_usage=usage_on))
            if d.text or (req.logprobs and d.logprobs):
                step.append(S.chat_chunk(rid, model, created, i, {"content": d.text} if d.text else {},
                                         logprobs=lp_entries(d.logprobs) if req.logprobs else None,
                                         with_usage=usage_on))
            if d.tool_calls:
                step.append(S.chat_chunk(rid, model, created, i, {"tool_calls": d.tool_calls},
                                         with_usage=usage_on))
            if d.finish_reason:
                step.append(S.chat_chunk(rid, model, created, i, {}, finish=d.finish_reason,
                                         with_usage=usage_on))
            for chunk in step:
                if req.timings_per_token:
                    chunk["timings"] = job.timings
                yield chunk
        if usage_on:
            yield {**S.usage_chunk(rid, model, created, "chat.completion.chunk", S.usage(
                job.prompt_tokens, job.completion_tokens, job.cached_tokens)), "timings": job.timings}   # as llama-server

    return sse(job, events())

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

async def completions(api: API, request: Request) -> Response:
    req = S.CompletionRequest.model_validate(await api.json_body(request))
    api.settle_fields(req)
    api.check_n(req.n)
    if req.n_probs and req.logprobs is None:
        req.logprobs = req.n_probs
    prompts = completion_prompts(api, req)
    if len(prompts) * req.n > api.cfg.n_parallel:
        raise invalid(f"prompts × n must be at most {api.cfg.n_parallel}", param="n")
    want_lp = req.logprobs is not None
    k = req.logprobs or 0
    params = api.sampling(req, max(k, 1) if want_lp else 0, req.n)
    grammar = await api.service.on_prompt_thread(compile_grammar, api.grammars, completion_options(req, api.cfg))
    for p in params:
        p.grammar = grammar
    per_choice = [p for p in prompts for _ in range(req.n)]
    job = await api.service.submit([Prompt(p) for p in per_choice], params * len(prompts), req.limit,
                                    ignore_eos=req.ignore_eos, stops=req.stop, id_slot=req.id_slot,
                                    n_keep=api.n_keep(req))
    rid, created, model = S.new_id("cmpl"), S.now(), api.model_id()
    tok = api.engine.tokenizer
    echo = [tok.decode(p) if req.echo else "" for p in per_choice]
    if req.echo and isinstance(req.prompt, str):
        echo = [req.prompt] * len(per_choice)

    def lp_obj(entries, offset):
        tokens = [(raw, lp, top[:k]) for raw, lp, top in api.logprob_tokens(entries)]
        return S.completion_logprobs(tokens, offset)

    n = len(per_choice)
    if not req.stream:
        texts = [[e] for e in echo]
        lps = [[] for _ in range(n)]
        finish = [None] * n

        async def collect():
            async for i, d in job:
                texts[i].append(d.text)
                lps[i].extend(d.logprobs)
                if d.finish_reason:
                    finish[i] = d.finish_reason

        await unless_disconnected(request, job, collect())
        choices = [S.completion_choice(i, "".join(texts[i]), finish[i],
                                       lp_obj(lps[i], len(echo[i])) if want_lp else None)
                   for i in range(n)]
        return JSONResponse({**S.completion(
            rid, model, created, choices,
            S.usage(job.prompt_tokens, job.completion_tokens, job.cached_tokens)), "timings": job.timings})

    usage_on = req.include_usage

    async def events():
        offsets = [len(e) for e in echo]
        for i, e in enumerate(echo):
            if e:
                yield S.completion_chunk(rid, model, created,
                                         S.completion_choice(i, e, None, None), usage_on)
        async for i, d in job:
            lp = lp_obj(d.logprobs, offsets[i]) if want_lp else None
            offsets[i] += len(d.text)
            yield S.completion_chunk(
                rid, model, created,
                S.completion_choice(i, d.text, d.finish_reason, lp), usage_on)
        if usage_on:
            yield {**S.usage_chunk(rid, model, created, "text_completion", S.usage(
                job.prompt_tokens, job.completion_tokens, job.cached_tokens)), "timings": job.timings}

    return sse(job, events())


def frame(obj) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


def named_frame(obj) -> str:
    """An SSE event named by the object's `type` (the Responses and Anthropic streams)."""
    return f"event: {obj['type']}\n" + frame(obj)


def sse(job: Job, events, framer=frame, end: str = "data: [DONE]\n\n") -> StreamingResponse:
    """Frame events as SSE; `end` last. The job is cancelled whenever the
    stream ends early (client disconnect cancels this generator)."""

    async def body():
        try:
            async for obj in events:
                yield framer(obj)
            yield end
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = to_api_error(e)
            yield f"data: {json.dumps(err.body(), ensure_ascii=False)}\n\n"
            yield end                   # the client can tell an ended stream from a cut one
        finally:
            job.close()

    return TimedStreamingResponse(body(), media_type="text/event-stream", headers={
        "Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def unless_disconnected(request: Request, job: Job, work) -> None:
    """Run `work`; if the client disconnects first, cancel it and the job."""

    async def disconnected():
        while True:
            msg = await request.receive()
            if msg["type"] == "http.disconnect":
                return

    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()
            return
        task.cancel()
        raise APIError(499, "Client closed request")
    finally:
        watch.cancel()
        job.close()
