"""What a response is made of (OpenAI's Responses API): ids, output items, the
response object of one turn, and the store of finished responses that
`previous_response_id` and GET /v1/responses/{id} read."""
from __future__ import annotations

import json
import uuid
from collections import OrderedDict

from ggserve.server.api import schemas as S
from ggserve.server.api.chat_answer import Answer
from ggserve.server.api.errors import APIError

KEPT = 256                 # stored responses for previous_response_id, at most
KEPT_BYTES = 64 * 2**20    # and at most this much JSON (data: URL images count in full)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseStore:
    """Responses by id, for `previous_response_id` and GET: the conversation that led
    to each (chat messages, without its instructions) and the response object. The
    least recently used go first when there are more than `size` or they take more
    than `max_bytes`. Each answers only to its owner (server/api/owners.py: the API key
    that created it): to another, it is not found."""

    def __init__(self, size: int = KEPT, max_bytes: int = KEPT_BYTES):
        self.size, self.max_bytes = size, max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, tuple[list[dict], dict, int, str]] = OrderedDict()

    def put(self, rid: str, messages: list[dict], response: dict, owner: str = "") -> None:
        if rid in self._items:
            self.bytes -= self._items.pop(rid)[2]
        n = len(json.dumps([messages, response], ensure_ascii=False))
        self._items[rid] = (messages, response, n, owner)
        self.bytes += n
        while self._items and (len(self._items) > self.size or self.bytes > self.max_bytes):
            self.bytes -= self._items.popitem(last=False)[1][2]

    def get(self, rid: str, owner: str = "") -> tuple[list[dict], dict]:
        item = self._items.get(rid)
        if item is None or item[3] != owner:        # another key's: as if there were none
            raise APIError(404, f"Response with id '{rid}' not found.", type="invalid_request_error",
                           code="response_not_found")
        self._items.move_to_end(rid)
        return item[0], item[1]

    def __contains__(self, rid: str) -> bool:
        return rid in self._items

    def delete(self, rid: str, owner: str = "") -> None:
        self.get(rid, owner)
        self.bytes -= self._items.pop(rid)[2]


def message_item(iid: str, text: str, status: str = "completed") -> dict:
    return {"id": iid, "type": "message", "status": status, "role": "assistant",
            "content": [output_text(text)] if status == "completed" else []}


def output_text(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(iid: str, text: str | None) -> dict:
    item = {"id": iid, "type": "reasoning", "summary": []}
    if text is not None:
        item["content"] = [{"type": "reasoning_text", "text": text}]
        item["status"] = "completed"
    return item


def call_item(iid: str, call: dict, status: str = "completed") -> dict:
    fn = call["function"]
    return {"id": iid, "type": "function_call", "status": status, "call_id": call["id"],
            "name": fn["name"], "arguments": fn["arguments"] if status == "completed" else ""}


def output_items(a: Answer) -> list[dict]:
    items = []
    if a.reasoning:
        items.append(reasoning_item(new_id("rs"), a.reasoning))
    if a.content or not a.calls:
        items.append(message_item(new_id("msg"), a.content))
    items += [call_item(new_id("fc"), c) for c in a.calls]
    return items


class Turn:
    """One request's fixed parts: its id, what the response object echoes back,
    and what is kept for the next turn."""

    def __init__(self, api, store: ResponseStore, body: dict, conversation: list[dict], owner: str = ""):
        self.api, self.store, self.body, self.conversation = api, store, body, conversation
        self.owner = owner          # whose it is (server/api/owners.py): only they read it back
        self.id, self.created = new_id("resp"), S.now()

    def response(self, status: str = "in_progress", output=(), a: Answer | None = None) -> dict:
        b = self.body
        r = {"id": self.id, "object": "response", "created_at": self.created, "status": status,
             "error": None, "incomplete_details": None, "instructions": b.get("instructions"),
             "max_output_tokens": b.get("max_output_tokens"), "model": self.api.model_id(),
             "output": list(output), "parallel_tool_calls": b.get("parallel_tool_calls", False),
             "previous_response_id": b.get("previous_response_id"),
             "reasoning": b.get("reasoning") or {"effort": None, "summary": None},
             "store": b.get("store", True), "temperature": b.get("temperature"),
             "text": b.get("text") or {"format": {"type": "text"}},
             "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
             "top_p": b.get("top_p"), "truncation": b.get("truncation", "disabled"),
             "usage": None, "user": b.get("user"), "metadata": b.get("metadata") or {}}
        if a is not None:
            r["completed_at"] = S.now()
            if a.finish == "length":
                r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            reasoning = len(self.api.engine.tokenizer.encode(a.reasoning)) if a.reasoning else 0
            r["usage"] = {"input_tokens": a.prompt_tokens,
                          "input_tokens_details": {"cached_tokens": a.cached_tokens},
                          "output_tokens": a.completion_tokens,
                          "output_tokens_details": {"reasoning_tokens": reasoning},
                          "total_tokens": a.prompt_tokens + a.completion_tokens}
        return r

    def finish(self, output: list[dict], a: Answer) -> dict:
        """The completed response; kept (unless store is false) for the next turn."""
        r = self.response("completed", output, a)
        if self.body.get("store", True):
            said = {"role": "assistant", "content": a.content}
            if a.reasoning:
                said["reasoning_content"] = a.reasoning
            if a.calls:
                said["tool_calls"] = a.calls
            self.store.put(self.id, self.conversation + [said], r, self.owner)
        return r
