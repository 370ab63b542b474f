"""The Messages API's stream: a chat job's deltas -> Anthropic's events.

message_start, ping; then one content block at a time (thinking, text, tool_use),
each content_block_start, content_block_delta... (thinking_delta, text_delta,
input_json_delta; a thinking block ends with an empty signature_delta),
content_block_stop; last message_delta (stop_reason, stop_sequence, usage: the
final counts, cache reads known only by then) and message_stop. An error once the
stream has started is an `error` event.
"""
from __future__ import annotations

import asyncio

from ggserve.server.api.anthropic.items import error_body, stop_reason, usage
from ggserve.server.api.chat_answer import Answer, finished
from ggserve.server.api.errors import to_api_error
from ggserve.server.service.jobs import Job


class _Blocks:
    """Content blocks in order; one is open at a time."""

    def __init__(self):
        self.n = 0
        self.open: str | None = None       # "thinking" | "text" | the open tool call's index
        self.calls: set[int] = set()

    def _start(self, key, block: dict) -> list[dict]:
        out = self.stop()
        self.open = key
        out.append({"type": "content_block_start", "index": self.n, "content_block": block})
        return out

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.n, "delta": delta}

    def thinking(self, piece: str) -> list[dict]:
        out = [] if self.open == "thinking" else self._start("thinking", {"type": "thinking", "thinking": "",
                                                                           "signature": ""})
        return out + [self._delta({"type": "thinking_delta", "thinking": piece})]

    def text(self, piece: str) -> list[dict]:
        out = [] if self.open == "text" else self._start("text", {"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": piece})]

    def call(self, d: dict) -> list[dict]:
        k = d["index"]
        out = []
        if k not in self.calls:
            self.calls.add(k)
            out = self._start(k, {"type": "tool_use", "id": d["id"], "name": d["function"]["name"], "input": {}})
        args = d["function"].get("arguments") or ""
        if args and self.open == k:
            out.append(self._delta({"type": "input_json_delta", "partial_json": args}))
        return out

    def stop(self) -> list[dict]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":       # the SDKs expect a signature; a local model has none
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append({"type": "content_block_stop", "index": self.n})
        self.open = None
        self.n += 1
        return out


async def events(mid: str, model: str, job: Job):
    a = Answer()
    start = {"id": mid, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": job.prompt_tokens, "output_tokens": 0,
                       "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    blocks = _Blocks()
    try:
        async for _, d in job:
            out = []
            if d.reasoning:
                out += blocks.thinking(d.reasoning)
            if d.text:
                out += blocks.text(d.text)
            for call in d.tool_calls:
                out += blocks.call(call)
            if d.finish_reason:
                a.finish = d.finish_reason
            for e in out:
                yield e
        for e in blocks.stop():
            yield e
        finished(job, a)
        yield {"type": "message_delta",
               "delta": {"stop_reason": stop_reason(a),
                         "stop_sequence": a.stop_sequence if a.finish != "length" else None},
               "usage": usage(a)}
        yield {"type": "message_stop"}
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        yield error_body(to_api_error(exc))
