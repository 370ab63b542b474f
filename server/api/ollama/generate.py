"""Ollama's /api/chat and /api/generate: NDJSON lines while it generates (`stream`, true
unless false), or one object; the last says `done`, `done_reason` and the durations in
nanoseconds. /api/chat runs on the chat path (templates, tools, thinking, images);
/api/generate renders `prompt` (with `system`, `images`) through the chat template unless
`raw`, adds Ollama's `context` tokens before it, and answers with the `context` to send
next time."""
from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from ggserve.server.api import schemas as S
from ggserve.server.api.chat_answer import Answer, finished
from ggserve.server.api.common import API
from ggserve.server.api.errors import invalid
from ggserve.server.api.ollama.convert import chat_messages, image_part, now_iso, ns, ollama_calls, sampling_fields
from ggserve.server.api.openai.generation import completion_sampling, request_prompt, submit_chat
from ggserve.server.chat.prompts import Prompt
from ggserve.server.service.jobs import Job

_NDJSON = "application/x-ndjson"


def _chat_body(body: dict, messages: list[dict]) -> dict:
    fields = sampling_fields(body)
    chat = {"messages": messages, "stream": False, **{k: v for k, v in fields.items() if k != "json_schema"}}
    if "json_schema" in fields:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "format", "schema": fields["json_schema"]}}
    if body.get("tools"):
        chat["tools"] = body["tools"]
    think = body.get("think")
    if isinstance(think, bool):
        chat["chat_template_kwargs"] = {"enable_thinking": think}
    return chat


def loaded_only(model: str, key: str, reason: str = "load") -> dict:
    """What a request without a prompt answers: Ollama loads (or, keep_alive 0, unloads) the model."""
    empty = {"role": "assistant", "content": ""} if key == "message" else ""
    return {"model": model, "created_at": now_iso(), key: empty, "done": True, "done_reason": reason}


def _end(model: str, t0: float, job: Job, finish: str | None) -> dict:
    t = job.timings
    return {"done": True, "done_reason": "length" if finish == "length" else "stop",
            "total_duration": ns(time.perf_counter() - t0), "load_duration": 0,
            "prompt_eval_count": job.prompt_tokens, "prompt_eval_duration": int(t["prompt_ms"] * 1e6),
            "eval_count": job.completion_tokens, "eval_duration": int(t["predicted_ms"] * 1e6)}


def _ndjson(lines) -> StreamingResponse:
    async def encode():
        async for obj in lines:
            yield json.dumps(obj, ensure_ascii=False) + "\n"
    return StreamingResponse(encode(), media_type=_NDJSON)


async def chat(api: API, request: Request) -> Response:
    """POST /api/chat."""
    body, t0 = await api.json_body(request), time.perf_counter()
    model = body.get("model") or api.model_id()
    if not body.get("messages"):
        return JSONResponse(loaded_only(model, "message"))
    req = S.ChatCompletionRequest.model_validate(_chat_body(body, chat_messages(body.get("messages") or [])))
    job = await submit_chat(api, req, salt=api.cache_salt(request, req))

    async def lines():
        answer = Answer()
        async for _, d in job:
            answer.finish = d.finish_reason or answer.finish
            if d.text or d.reasoning:
                msg = {"role": "assistant", "content": d.text}
                if d.reasoning:
                    msg["thinking"] = d.reasoning
                yield {"model": model, "created_at": now_iso(), "message": msg, "done": False}
        finished(job, answer)
        msg = {"role": "assistant", "content": ""}
        if answer.calls:
            msg["tool_calls"] = ollama_calls(answer.calls)
        yield {"model": model, "created_at": now_iso(), "message": msg, **_end(model, t0, job, answer.finish)}

    if body.get("stream", True):
        return _ndjson(lines())
    return JSONResponse(await _whole(lines(), "message"))


async def _whole(lines, key: str) -> dict:
    """A stream's lines as one object: the texts joined, the last line's fields."""
    text, thinking, last = [], [], {}
    async for obj in lines:
        part = obj[key] if key == "response" else obj[key]["content"]
        text.append(part)
        if key == "message":
            thinking.append(obj[key].get("thinking", ""))
        last = obj
    if key == "message":
        last["message"]["content"] = "".join(text)
        if "".join(thinking):
            last["message"]["thinking"] = "".join(thinking)
    else:
        last["response"] = "".join(text)
    return last


async def _generate_prompt(api: API, body: dict) -> Prompt:
    """The prompt /api/generate runs: `context` tokens, then the prompt (templated unless raw)."""
    text, context = body.get("prompt") or "", body.get("context") or []
    if not isinstance(text, str):
        raise invalid("prompt: must be a string", param="prompt")
    if not isinstance(context, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in context):
        raise invalid("context: a list of token ids", param="context")
    tok = api.engine.tokenizer
    if any(not 0 <= t < tok.n_vocab for t in context):
        raise invalid("context: a token id out of range", param="context")
    if body.get("suffix"):
        raise invalid("suffix: fill-in-the-middle is served at /infill (input_prefix, input_suffix)", param="suffix")
    if body.get("template"):
        raise invalid("template: Go templates are not rendered; the model's chat template is used "
                      "(or raw: true with the prompt as it should run)", param="template")
    if body.get("raw"):
        return Prompt(list(context) + tok.encode(text, add_special=not context, parse_special=True))
    user: object = text
    if body.get("images"):
        user = [{"type": "text", "text": text}] + [image_part(x, f"images.{i}") for i, x in enumerate(body["images"])]
    msgs = ([{"role": "system", "content": body["system"]}] if body.get("system") else []) + \
        [{"role": "user", "content": user}]
    req = S.ChatCompletionRequest.model_validate(_chat_body(body, msgs))
    prompt = await request_prompt(api, req)
    if context and prompt.images:
        raise invalid("context: not with images", param="context")
    return Prompt(list(context) + prompt.tokens) if context else prompt


async def generate(api: API, request: Request) -> Response:
    """POST /api/generate."""
    body, t0 = await api.json_body(request), time.perf_counter()
    model = body.get("model") or api.model_id()
    if not body.get("prompt") and not body.get("images"):
        return JSONResponse(loaded_only(model, "response"))
    prompt = await _generate_prompt(api, body)
    fields = sampling_fields(body)
    req = S.CompletionRequest.model_validate({"prompt": prompt.tokens, **fields})
    api.settle_fields(req)
    params = await completion_sampling(api, req, 1, 1)
    job = await api.service.submit([prompt], params, fields.get("max_tokens"), stops=req.stop,
                                   cache_salt=api.cache_salt(request, req))

    async def lines():
        ids, finish = [], None
        async for _, d in job:
            ids += [entry[0] for entry in d.logprobs]
            finish = d.finish_reason or finish
            if d.text:
                yield {"model": model, "created_at": now_iso(), "response": d.text, "done": False}
        yield {"model": model, "created_at": now_iso(), "response": "", **_end(model, t0, job, finish),
               "context": list(prompt.tokens) + ids}

    if body.get("stream", True):
        return _ndjson(lines())
    return JSONResponse(await _whole(lines(), "response"))
