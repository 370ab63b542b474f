"""One HTTP request as the service sees it.

A Job is one HTTP request: one engine request per choice (n > 1, or several
prompts in /v1/completions), one queue for all of them. Iterating a Job yields
(choice index, Delta): detokenized text with stop strings cut out, the logprobs
of the tokens behind that text, and the finish reason.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from ggserve.server.chat.stops import StopMatcher


@dataclass
class Delta:
    text: str = ""
    # (token id, logprob, [(token id, logprob), ...]) for each token behind `text`
    logprobs: list[tuple[int, float | None, list[tuple[int, float]]]] = field(
        default_factory=list)
    finish_reason: str | None = None
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    # return_progress: llama-server's prompt_progress {total, cache, processed, time_ms}
    progress: dict | None = None
    # the end-of-generation token that ended the choice, as a logprobs entry: it has no text, so
    # no stream delta carries it, but llama-server lists it in whole answers and native streams
    eog: tuple[int, float | None, list[tuple[int, float]]] | None = None


class Choice:
    """Turns one engine request's TokenEvents into Deltas."""

    def __init__(self, request_id: str, tokenizer, decoder, stops: list[str] | None,
                 output=None):
        self.request_id = request_id
        self.tokenizer = tokenizer
        self.decoder = decoder
        self.stops = StopMatcher(stops)
        self.output = output      # server/chat/output.py ChatOutput: reasoning and tool calls
        self.finish_reason: str | None = None
        self.engine_done = False
        self.n_tokens = 0
        self.n_prompt = 0
        self.n_cached = 0
        self.n_draft = self.n_draft_accepted = 0     # speculative decoding: drafted, accepted tokens
        self.eog_token: int | None = None     # the end-of-generation token that ended it (not in the text)
        self.t_progress: float | None = None
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._text_len = 0      # characters decoded so far
        self._emitted = 0       # characters released to the client
        self._pending: list[tuple[int, tuple]] = []  # (start offset, logprob entry)

    def feed(self, ev) -> Delta:
        self.n_prompt, self.n_cached = ev.n_prompt, ev.n_cached
        if ev.progress is not None:     # time_ms: since the first report, when the prompt started (llama-server)
            now = time.perf_counter()
            self.t_progress = self.t_progress or now
            return Delta(progress={"total": ev.n_prompt, "cache": ev.n_cached, "processed": ev.progress,
                                   "time_ms": int((now - self.t_progress) * 1000)})
        self.n_draft, self.n_draft_accepted = ev.n_draft, ev.n_draft_accepted
        out, eog = "", None
        if ev.token is not None:
            self.n_tokens += 1
            eog_stop = ev.finish_reason == "stop" and self.tokenizer.is_eog(ev.token)
            if eog_stop:
                self.eog_token = ev.token
                eog = (ev.token, ev.logprob, list(ev.top_logprobs or ()))
            else:
                piece = self.decoder.push(ev.token)
                self._pending.append((self._text_len, (ev.token, ev.logprob,
                                                       list(ev.top_logprobs or ()))))
                self._text_len += len(piece)
                out = self.stops.push(piece)
        finish = ev.finish_reason
        if finish is not None:
            self.engine_done = True
            out += self.stops.push(self.decoder.flush())
            out += self.stops.flush()
        if self.stops.stopped:
            finish = "stop"
        self._emitted += len(out)
        delta = Delta(out, self._release(finish is not None), finish, eog=eog)
        if self.output is not None:
            parts = self.output.feed(out)
            if finish is not None:
                end = self.output.finish()
                parts.reasoning += end.reasoning
                parts.content += end.content
                parts.tool_calls += end.tool_calls
                if finish == "stop" and self.output.calls:
                    delta.finish_reason = finish = "tool_calls"
            delta.text, delta.reasoning, delta.tool_calls = parts.content, parts.reasoning, parts.tool_calls
        self.finish_reason = finish
        return delta

    def _release(self, final: bool) -> list:
        """Logprob entries of the tokens whose text has been released.

        A token is released once text starting at its offset has gone out; at a
        stop string, tokens entirely inside the stop are dropped."""
        if final and not self.stops.stopped:
            done, self._pending = self._pending, []
        else:
            n = 0
            while n < len(self._pending) and self._pending[n][0] < self._emitted:
                n += 1
            done, self._pending = self._pending[:n], self._pending[n:]
            if final:
                self._pending = []
        return [entry for _, entry in done]


class Job:
    """One HTTP request's engine requests. Iterate it for (index, Delta)."""

    def __init__(self, prompts: list[list[int]], choices: list[Choice], cancel: Callable[[str], None]):
        self.prompts = prompts
        self.queue: asyncio.Queue = asyncio.Queue()
        self.choices = choices
        self._cancel = cancel             # the service's: ends an engine request
        self.t_submit = time.perf_counter()
        self._open = len(self.choices)

    async def __aiter__(self) -> AsyncIterator[tuple[int, Delta]]:
        while self._open:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            index, ev = item
            choice = self.choices[index]
            if choice.finish_reason is not None:
                continue  # stopped by a stop string; late events from the engine
            delta = choice.feed(ev)
            if delta.finish_reason is not None:
                self._open -= 1
                if not choice.engine_done:
                    self._cancel(choice.request_id)
            if (delta.text or delta.logprobs or delta.finish_reason or delta.reasoning or delta.tool_calls
                    or delta.progress):
                yield index, delta

    def close(self) -> None:
        """Cancel whatever is still running (client gone, error, or done)."""
        for c in self.choices:
            if not c.engine_done:
                c.engine_done = True
                self._cancel(c.request_id)

    # usage
    @property
    def prompt_tokens(self) -> int:
        seen, total = set(), 0
        for p, c in zip(self.prompts, self.choices):
            key = id(p)
            if key not in seen:
                seen.add(key)
                total += c.n_prompt or len(p)
        return total

    @property
    def completion_tokens(self) -> int:
        return sum(c.n_tokens for c in self.choices)

    @property
    def cached_tokens(self) -> int:
        return self.choices[0].n_cached

    @property
    def timings(self) -> dict:
        """llama-server's `timings` of an answer: generated tokens, the time from the first
        to the last, and with speculative decoding the drafted and accepted tokens."""
        c = self.choices[0]
        return self._timings(c, self.prompt_tokens - self.cached_tokens, self.completion_tokens,
                             sum(x.n_draft for x in self.choices), sum(x.n_draft_accepted for x in self.choices))

    def choice_timings(self, i: int) -> dict:
        """The same for choice i alone (the native endpoints give one per prompt)."""
        c = self.choices[i]
        return self._timings(c, max(c.n_prompt - c.n_cached, 0), c.n_tokens, c.n_draft, c.n_draft_accepted)

    def _timings(self, c: Choice, prompt_n: int, predicted_n: int, n_draft: int, n_accepted: int) -> dict:
        # llama-server times the prompt's compute; here: from arrival to the first token
        prompt_ms = (c.t_first - self.t_submit) * 1000 if c.t_first is not None else 0.0
        ms = (c.t_last - c.t_first) * 1000 if c.t_first is not None and c.t_last is not None else 0.0
        steps = max(c.n_tokens - 1, 0)
        out = {"cache_n": c.n_cached,
               "prompt_n": prompt_n, "prompt_ms": prompt_ms,
               "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
               "prompt_per_second": prompt_n * 1000 / prompt_ms if prompt_ms else 0.0,
               "predicted_n": predicted_n, "predicted_ms": ms,
               "predicted_per_token_ms": ms / steps if steps else 0.0,
               "predicted_per_second": steps * 1000 / ms if ms else 0.0}
        if n_draft:
            out.update(draft_n=n_draft, draft_n_accepted=n_accepted)
        return out
