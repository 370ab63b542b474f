"""The Responses API's stream: a chat job's deltas -> OpenAI's events, each with a
`sequence_number`.

response.created, response.in_progress; then for each output item
output_item.added, its content events, output_item.done — a message:
content_part.added, output_text.delta..., output_text.done, content_part.done;
a function call: function_call_arguments.delta..., .done; reasoning:
reasoning_text.delta..., .done — and last response.completed
(response.incomplete when max_output_tokens ended it). An error once the stream
has started is an `error` event, then response.failed.
"""
from __future__ import annotations

import asyncio

from ggserve.server.api.chat_answer import Answer, finished
from ggserve.server.api.errors import to_api_error
from ggserve.server.api.openai.responses_items import Turn, call_item, message_item, new_id, output_text, reasoning_item
from ggserve.server.service.jobs import Job


class _Output:
    """Output items as they stream: a message or reasoning item stays open until
    another kind of output starts; function calls until the end."""

    def __init__(self):
        self.seq = 0
        self.items: list[dict] = []
        self.text: dict[int, str] = {}      # output index -> text or arguments so far
        self.open: int | None = None        # the open message or reasoning item
        self.calls: dict[int, int] = {}     # tool call index -> output index

    def ev(self, type: str, **fields) -> dict:
        e = {"type": type, "sequence_number": self.seq, **fields}
        self.seq += 1
        return e

    def _add(self, item: dict) -> tuple[int, dict]:
        self.items.append(item)
        i = len(self.items) - 1
        self.text[i] = ""
        return i, self.ev("response.output_item.added", output_index=i, item=item)

    def _piece(self, kind: str, piece: str) -> list[dict]:
        out = []
        if self.open is None or self.items[self.open]["type"] != kind:
            out += self._close_open()
            if kind == "message":
                self.open, added = self._add(message_item(new_id("msg"), "", "in_progress"))
                out += [added, self.ev("response.content_part.added", item_id=self.items[self.open]["id"],
                                       output_index=self.open, content_index=0, part=output_text(""))]
            else:
                self.open, added = self._add(reasoning_item(new_id("rs"), None))
                out.append(added)
        i = self.open
        self.text[i] += piece
        name = "response.output_text.delta" if kind == "message" else "response.reasoning_text.delta"
        extra = {"logprobs": []} if kind == "message" else {}
        out.append(self.ev(name, item_id=self.items[i]["id"], output_index=i, content_index=0,
                           delta=piece, **extra))
        return out

    def content(self, piece: str) -> list[dict]:
        return self._piece("message", piece)

    def reasoning(self, piece: str) -> list[dict]:
        return self._piece("reasoning", piece)

    def call(self, delta: dict) -> list[dict]:
        out = []
        k = delta["index"]
        if k not in self.calls:
            out += self._close_open()
            call = {"id": delta["id"], "function": {"name": delta["function"]["name"], "arguments": ""}}
            self.calls[k], added = self._add(call_item(new_id("fc"), call, "in_progress"))
            out.append(added)
        i = self.calls[k]
        args = delta["function"].get("arguments") or ""
        if args:
            self.text[i] += args
            out.append(self.ev("response.function_call_arguments.delta", item_id=self.items[i]["id"],
                               output_index=i, delta=args))
        return out

    def _close_open(self) -> list[dict]:
        i, self.open = self.open, None
        if i is None:
            return []
        iid, text = self.items[i]["id"], self.text[i]
        if self.items[i]["type"] == "message":
            self.items[i] = message_item(iid, text)
            out = [self.ev("response.output_text.done", item_id=iid, output_index=i, content_index=0,
                           text=text, logprobs=[]),
                   self.ev("response.content_part.done", item_id=iid, output_index=i, content_index=0,
                           part=output_text(text))]
        else:
            self.items[i] = reasoning_item(iid, text)
            out = [self.ev("response.reasoning_text.done", item_id=iid, output_index=i, content_index=0,
                           text=text)]
        return out + [self.ev("response.output_item.done", output_index=i, item=self.items[i])]

    def close(self) -> list[dict]:
        out = self._close_open()
        if not self.calls and not any(it["type"] == "message" for it in self.items):
            out += self.content("")          # as the whole answer: a message, even an empty one
            out += self._close_open()
        for i in self.calls.values():
            item = self.items[i]
            self.items[i] = {**item, "status": "completed", "arguments": self.text[i]}
            out += [self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                            name=item["name"], arguments=self.text[i]),
                    self.ev("response.output_item.done", output_index=i, item=self.items[i])]
        return out


async def events(turn: Turn, job: Job, timed: bool = False):
    """The stream's events. llama-server's telemetry on top of OpenAI's: prompt_progress reports
    (return_progress) as response.in_progress events, `timings` on the last event of each
    step's output (timings_per_token: timed) and on the final event."""
    out = _Output()
    yield out.ev("response.created", response=turn.response())
    yield out.ev("response.in_progress", response=turn.response())
    a = Answer()
    try:
        async for _, d in job:
            if d.progress:
                yield out.ev("response.in_progress", response=turn.response(), prompt_progress=d.progress)
            step: list[dict] = []
            if d.reasoning:
                a.reasoning += d.reasoning
                step += out.reasoning(d.reasoning)
            if d.text:
                a.content += d.text
                step += out.content(d.text)
            for call in d.tool_calls:
                step += out.call(call)
            if d.finish_reason:
                a.finish = d.finish_reason
            if step and timed:
                step[-1]["timings"] = job.timings
            for e in step:
                yield e
        for e in out.close():
            yield e
        r = turn.finish(out.items, finished(job, a))
        yield {**out.ev("response.completed" if r["status"] == "completed" else "response.incomplete", response=r),
               "timings": job.timings}
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        err = to_api_error(exc)
        yield out.ev("error", code=err.code or err.type, message=err.message, param=err.param)
        failed = turn.response("failed", out.items)
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        yield out.ev("response.failed", response=failed)
