"""How a generation's answer reaches its client, whatever the API: collected whole while
the client waits (a disconnect cancels the job), or streamed as server-sent events."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import StreamingResponse

from ggserve.server.api.errors import APIError, to_api_error
from ggserve.server.api.limits import TimedStreamingResponse
from ggserve.server.service.jobs import Job


@dataclass
class Collected:
    """Each choice's deltas, gathered for a whole answer."""
    texts: list[list[str]]
    reasoning: list[list[str]]
    logprobs: list[list]            # the deltas' (token id, logprob, top) entries, in order, the EOG's last
    finish: list[str | None]

    def text(self, i: int) -> str:
        return "".join(self.texts[i])

    def reasoning_text(self, i: int) -> str:
        return "".join(self.reasoning[i])


async def collect(request: Request, job: Job, n: int) -> Collected:
    """The whole answer of the job's n choices, unless the client disconnects first."""
    got = Collected([[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)], [None] * n)

    async def read():
        async for i, d in job:
            got.texts[i].append(d.text)
            got.reasoning[i].append(d.reasoning)
            got.logprobs[i].extend(d.logprobs)
            if d.eog is not None:
                got.logprobs[i].append(d.eog)
            if d.finish_reason:
                got.finish[i] = d.finish_reason

    await unless_disconnected(request, job, read())
    return got


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
