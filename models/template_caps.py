"""What a chat template can take, found as llama.cpp 11434 finds it (common/jinja/caps.cpp):
render small probe conversations and watch which of their values the template reads.

A value counts as read when the template looks it up by key (`message.content`,
`message['content']`, `.get`), or walks a whole object (`tojson`, `.items()`), as
llama.cpp's jinja marks values "used" during its capability pass. The results pick
llama.cpp's polyfills (common/chat.cpp, namespace workaround): a system message folded
into the next one, tool-call arguments given as objects.
"""
from __future__ import annotations

from dataclasses import dataclass


class Watched(dict):
    """A dict that records which of its keys a template read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read: set = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in self:
            self.read.add(key)
        return super().get(key, default)

    def items(self):
        read_all(self)
        return super().items()

    def values(self):
        read_all(self)
        return super().values()


def read_all(value) -> None:
    """A whole object walked (tojson, items(), |string): every key read, all the way down."""
    if isinstance(value, Watched):
        value.read.update(dict.keys(value))
        for v in dict.values(value):
            read_all(v)
    elif isinstance(value, list):
        for v in value:
            read_all(v)


def watch(value):
    """JSON-like data with every dict Watched (lists stay lists)."""
    if isinstance(value, dict):
        return Watched({k: watch(v) for k, v in value.items()})
    if isinstance(value, list):
        return [watch(v) for v in value]
    return value


@dataclass(frozen=True)
class Caps:
    system_role: bool = True
    tools: bool = True
    tool_calls: bool = True
    object_arguments: bool = False


_TOOLS = [{"name": "tool", "type": "function", "function": {
    "name": "tool1", "description": "Tool description",
    "parameters": {"type": "object", "properties": {"arg": {"type": "string", "description": "Arg description"}},
                   "required": ["arg"]}}}]


def _tool_chat(arguments) -> list[dict]:
    return [{"role": "user", "content": "User message"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call00001", "type": "function", "function": {"name": "tool1", "arguments": arguments}}]},
            {"role": "tool", "content": "Tool response", "tool_call_id": "call00001"},
            {"role": "assistant", "content": "The tool response was 'tool response'"},
            {"role": "user", "content": "User message"}]


def probe_caps(render) -> Caps:
    """render(messages, tools) renders with bos/eos "" and a generation prompt and may raise."""
    def run(messages, tools=()):
        messages, tools = watch(messages), watch(list(tools))
        try:
            render(messages, tools)
            return True, messages, tools
        except Exception:
            return False, messages, tools

    _, msgs, _ = run([{"role": "system", "content": "System message"}, {"role": "user", "content": "User message"}])
    system_role = "content" in msgs[0].read

    ok, msgs, tools = run(_tool_chat({"arg": "value"}), _TOOLS)
    if ok:
        call = msgs[1]["tool_calls"][0] if "tool_calls" in msgs[1].read else None
        uses_tools = "name" in tools[0]["function"].read
        if call is None:
            return Caps(system_role, uses_tools, False, False)
        if "arg" in call["function"]["arguments"].read:
            return Caps(system_role, uses_tools, True, True)
    ok, msgs, tools = run(_tool_chat('{"arg": "value"}'), _TOOLS)
    if not ok:
        return Caps(system_role, False, False, False)
    return Caps(system_role, "name" in tools[0]["function"].read, "tool_calls" in msgs[1].read, False)


class ProbeText(str):
    """A probe's string content that records how a template used it."""
    ops: set

    def __getitem__(self, key):
        if isinstance(key, int):
            note(self, "array_access")
        return str.__getitem__(self, key)

    def __iter__(self):
        note(self, "array_access")
        return str.__iter__(self)


class ProbeParts(list):
    """A probe's list content that records how a template used it."""
    ops: set

    def __getitem__(self, key):
        if isinstance(key, int):
            note(self, "array_access")
        return list.__getitem__(self, key)

    def __iter__(self):
        note(self, "array_access")
        return list.__iter__(self)


def note(value, op: str) -> None:
    """Record an operation on probe content (tests and filters call this with what they get)."""
    if isinstance(value, (ProbeText, ProbeParts)):
        value.ops.add(op)


_MARK = "STRING_MARKER"


def probe_content(render) -> tuple[bool, bool]:
    """(takes string content, takes typed content) as llama.cpp's caps decide it: content
    the template indexes, iterates or filters with selectattr is typed; a template that
    fails on a string, or uses it as an array without writing it, does not take strings.
    render(messages) renders and may raise."""
    def run(content):
        content.ops = set()
        try:
            out, ok = render([{"role": "user", "content": content}]), True
        except Exception:
            out, ok = "", False
        return ok, out, "selectattr" in content.ops or "array_access" in content.ops, content.ops

    ok, out, as_array, ops = run(ProbeText(_MARK))
    string, typed = True, as_array
    if not ok or (as_array and _MARK not in out):
        string = False
    if "test_is_string" in ops:
        ok, _, as_array, _ = run(ProbeParts())
        typed = typed or (ok and as_array)
    return string, typed
