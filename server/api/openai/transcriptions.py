"""/v1/audio/transcriptions (and /audio/transcriptions): OpenAI's multipart request,
answered by the audio model as llama-server 11434 answers it.

ref: llama.cpp tools/server/server-chat.cpp (convert_transcriptions_to_chatcmpl),
server-task.cpp (to_json_oaicompat_asr), common/chat.cpp (common_chat_get_asr_prompt).
The form becomes a chat completion: one user message, `prompt` (default "Transcribe audio
to text"; LFM2 templates: no user text, the system prompt "Perform ASR.") plus
" (language: X)" for `language`, then the clip; `temperature` and `max_tokens` come as
strings. llama-server answers `json` only ({type: transcript.text.done, text, usage}); we
answer OpenAI's other formats too: `text`, `verbose_json` (one segment: the whole clip),
`srt` and `vtt`; `stream=true` sends transcript.text.delta events, then the done event.
"""
from __future__ import annotations

import asyncio
import base64

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from ggserve.server.api import schemas as S
from ggserve.server.api.chat_answer import collect
from ggserve.server.api.common import API
from ggserve.server.api.delivery import sse
from ggserve.server.api.errors import invalid
from ggserve.server.api.media_parts import decode_clip
from ggserve.server.api.openai.generation import submit_chat

FORMATS = ("json", "text", "verbose_json", "srt", "vtt")
ASR_PROMPT = "Transcribe audio to text"


def asr_messages(template_source: str, prompt: str, language: str, clip: bytes) -> list[dict]:
    """The chat llama-server makes of a transcription form."""
    lfm2 = "<|tool_list_start|>" in template_source and "<|tool_list_end|>" in template_source
    text = prompt or ("" if lfm2 else ASR_PROMPT)
    if language:
        text += f" (language: {language})"
    audio = {"type": "input_audio", "input_audio": {"data": base64.b64encode(clip).decode()}}
    user = {"role": "user", "content": [{"type": "text", "text": text}, audio] if text else [audio]}
    return ([{"role": "system", "content": "Perform ASR."}] if lfm2 else []) + [user]


async def form_fields(api: API, request: Request) -> tuple[bytes, dict[str, str]]:
    """The uploaded file's bytes and the string fields; 400 for a bad form or no file."""
    try:
        form = await request.form(max_files=1, max_fields=32)
    except Exception as e:  # noqa: BLE001 - any parse failure is the client's malformed form
        raise invalid(f"Could not read the multipart form: {e}", code="invalid_request_error") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise invalid("No input file found for transcription", param="file")
    limit = api.media.audio_max_bytes
    data = await upload.read(limit + 1)
    if len(data) > limit:
        raise invalid(f"The audio file is larger than the limit of {limit} bytes (--audio-max-bytes).",
                      param="file", code="audio_too_large")
    return data, {k: v for k, v in form.items() if isinstance(v, str)}


def chat_body(fields: dict[str, str], messages: list[dict]) -> S.ChatCompletionRequest:
    body: dict = {"model": fields.get("model", ""), "messages": messages,
                  "stream": fields.get("stream", "false") == "true"}
    try:
        if "max_tokens" in fields:
            body["max_tokens"] = int(fields["max_tokens"])
        if "temperature" in fields:
            body["temperature"] = float(fields["temperature"])
    except ValueError as e:
        raise invalid(f"Invalid number in the form: {e}") from None
    return S.ChatCompletionRequest.model_validate(body)


async def transcribe(api: API, request: Request) -> Response:
    """POST /v1/audio/transcriptions."""
    clip, fields = await form_fields(api, request)
    fmt = fields.get("response_format", "json")
    if fmt not in FORMATS:
        raise invalid(f"response_format must be one of {', '.join(FORMATS)}", param="response_format")
    api.engine                                                # 503 while loading
    api.service.prompts.check_audio(1)
    seconds = (await asyncio.to_thread(decode_clip, clip, api.media, api.service.prompts.audio.sample_rate,
                                       "file")).seconds
    source = getattr(api.engine.chat_template, "source", "")
    req = chat_body(fields, asr_messages(source, fields.get("prompt", ""), fields.get("language", ""), clip))
    job = await submit_chat(api, req, salt=api.cache_salt(request, req))
    if req.stream:
        return sse(job, stream_events(job), end="")
    answer = await collect(request, job)
    usage = {"type": "tokens", "input_tokens": answer.prompt_tokens, "output_tokens": answer.completion_tokens,
             "total_tokens": answer.prompt_tokens + answer.completion_tokens,
             "input_tokens_details": {"cached_tokens": answer.cached_tokens}}
    return formatted(fmt, answer.content, seconds, fields.get("language", ""), usage)


async def stream_events(job):
    text = []
    async for _, d in job:
        if d.text:
            text.append(d.text)
            yield {"type": "transcript.text.delta", "delta": d.text}
    usage = {"type": "tokens", "input_tokens": job.prompt_tokens, "output_tokens": job.completion_tokens,
             "total_tokens": job.prompt_tokens + job.completion_tokens}
    yield {"type": "transcript.text.done", "text": "".join(text), "usage": usage}


def formatted(fmt: str, text: str, seconds: float, language: str, usage: dict) -> Response:
    if fmt == "json":
        return JSONResponse({"type": "transcript.text.done", "text": text, "usage": usage})
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "verbose_json":
        segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text, "tokens": [],
                   "temperature": 0.0, "avg_logprob": 0.0, "compression_ratio": 0.0, "no_speech_prob": 0.0}
        return JSONResponse({"task": "transcribe", "language": language or "unknown", "duration": round(seconds, 3),
                             "text": text, "segments": [segment], "usage": {"type": "duration", "seconds": seconds}})
    if fmt == "srt":
        return PlainTextResponse(f"1\n{_stamp(0, ',')} --> {_stamp(seconds, ',')}\n{text.strip()}\n\n")
    return PlainTextResponse(f"WEBVTT\n\n{_stamp(0, '.')} --> {_stamp(seconds, '.')}\n{text.strip()}\n\n",
                             media_type="text/vtt")


def _stamp(seconds: float, sep: str) -> str:
    ms = int(round(seconds * 1000))
    return f"{ms // 3600000:02d}:{ms // 60000 % 60:02d}:{ms // 1000 % 60:02d}{sep}{ms % 1000:03d}"


def routes(api: API, route) -> list:
    return [route(p, lambda request: transcribe(api, request), ["POST"], "audio_transcriptions")
            for p in ("/v1/audio/transcriptions", "/audio/transcriptions")]

