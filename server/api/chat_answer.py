"""One chat job's whole answer, for the APIs translated onto chat completions
(/v1/responses, /v1/messages): the content, reasoning and tool calls of its single
choice, why it ended, and its token counts."""
from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from ggserve.server.api.delivery import unless_disconnected
from ggserve.server.service.jobs import Job


@dataclass
class Answer:
    content: str = ""
    reasoning: str = ""
    calls: list[dict] = field(default_factory=list)     # OpenAI tool_calls, complete
    finish: str | None = None                           # stop | length | tool_calls
    stop_sequence: str | None = None                    # the stop string that ended it
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


def finished(job: Job, answer: Answer) -> Answer:
    """Fill in what is known once the job's only choice has ended."""
    choice = job.choices[0]
    answer.calls = list(choice.output.calls) if choice.output else []
    answer.stop_sequence = choice.stops.matched
    answer.prompt_tokens = job.prompt_tokens
    answer.completion_tokens = job.completion_tokens
    answer.cached_tokens = job.cached_tokens
    return answer


async def collect(request: Request, job: Job) -> Answer:
    """Run the job to its end (cancelled if the client goes away first)."""
    answer = Answer()
    content, reasoning = [], []

    async def run():
        async for _, d in job:
            content.append(d.text)
            reasoning.append(d.reasoning)
            if d.finish_reason:
                answer.finish = d.finish_reason

    await unless_disconnected(request, job, run())
    answer.content, answer.reasoning = "".join(content), "".join(reasoning)
    return finished(job, answer)
