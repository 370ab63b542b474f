"""Where a chat template writes reasoning, found as llama.cpp 11434's autoparser finds it
(common/chat-diff-analyzer.cpp, analyze_reasoning): render variants of a small
conversation and read the markers around the reasoning text from their differences.

The start and end markers, whitespace included, decide three things llama-server does:
whether the template "supports thinking" (llama-server's default enable_thinking is that,
unless reasoning is off), how a continued assistant message is written (the generation
prompt up to the start marker, the reasoning, the end marker, the content), and the tags
its parser looks for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

USER = {"role": "user", "content": "U_USER_MSG Hello END_U"}
ANSWER = "A_ASST_MSG I can help END_A"
THINKING = "REASON_PART I am thinking END_R"


@dataclass(frozen=True)
class Reasoning:
    start: str = ""      # e.g. "<think>\n" (may be empty when only an end marker is written)
    end: str = ""        # e.g. "\n</think>\n\n"

    @property
    def supported(self) -> bool:
        return bool(self.start or self.end)


@dataclass(frozen=True)
class _Segment:
    marker: bool
    value: str


def segments(text: str) -> list[_Segment]:
    """Text cut into <...> / [...] markers and the text between (segmentize_markers)."""
    out, border, opener = [], 0, ""
    for i, c in enumerate(text):
        if not opener and c in "<[":
            if border < i:
                out.append(_Segment(False, text[border:i]))
            border, opener = i, c
        elif opener and c == {"<": ">", "[": "]"}[opener]:
            out.append(_Segment(True, text[border:i + 1]))
            border, opener = i + 1, ""
    if border < len(text):
        out.append(_Segment(False, text[border:]))
    return out


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _common_suffix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[len(a) - 1 - n] == b[len(b) - 1 - n]:
        n += 1
    return n


def diff_split(left: str, right: str) -> tuple[str, str]:
    """(what only left has, what only right has), cut at marker boundaries first
    (calculate_diff_split)."""
    L, R = segments(left), segments(right)
    if not L or not R:
        return left if R else "", right if L else right
    ls, le, rs, re_ = 0, len(L) - 1, 0, len(R) - 1
    l_done = r_done = False
    while ls != le and rs != re_:
        advanced = False
        if L[ls] == R[rs]:
            ls, rs, advanced = ls + 1, rs + 1, True
        if L[le] == R[re_]:
            if ls != le:
                le -= 1
            else:
                l_done = True
            if rs != re_:
                re_ -= 1
            else:
                r_done = True
            advanced = True
        if not advanced:
            break
    if ls == le and rs != re_:
        if L[ls] == R[re_]:
            re_, l_done = re_ - 1, True
        elif L[ls] == R[rs]:
            rs, l_done = rs + 1, True
    elif rs == re_ and ls != le:
        if L[le] == R[rs]:
            le, r_done = le - 1, True
        elif L[ls] == R[rs]:
            ls, r_done = ls + 1, True
    elif ls == le and rs == re_ and L[ls] == R[rs] and L[ls].marker:
        l_done = r_done = True
    text_suffix = not L[le].marker and not R[re_].marker
    text_prefix = not R[rs].marker and not L[ls].marker
    rem_l = "".join(s.value for s in L[ls:le if l_done else le + 1])
    rem_r = "".join(s.value for s in R[rs:re_ if r_done else re_ + 1])
    suffix = _common_suffix(rem_l, rem_r) if text_suffix else 0
    prefix = _common_prefix(rem_l[:len(rem_l) - suffix], rem_r[:len(rem_r) - suffix]) if text_prefix else 0
    only_l, only_r = rem_l[prefix:len(rem_l) - suffix], rem_r[prefix:len(rem_r) - suffix]
    if not only_l and only_r and right.startswith(left):
        only_r = right[len(left):]
    return only_l, only_r


_SPACE = r"[ \t\r\n]*"
_MARKER = r"(?:<[^>]*>|\[[^\]]*\])"


def _around(text: str) -> tuple[str, str] | None:
    """The markers around THINKING in a rendering: (pre, post), pre "" when none."""
    wrapped = re.search(f"({_MARKER}{_SPACE}){re.escape(THINKING)}({_SPACE}{_MARKER}{_SPACE})", text)
    if wrapped:
        return wrapped.group(1), wrapped.group(2)
    after = re.search(f"{re.escape(THINKING)}{_SPACE}({_MARKER}{_SPACE})?", text)
    if after:
        return "", after.group(1) or ""
    return None


def analyze(render, source: str, tool_calls: bool) -> Reasoning:
    """render(messages, add_generation_prompt, enable_thinking, tools=None) -> text (raises on
    failure). tool_calls: the template writes earlier tool calls (template_caps.Caps)."""
    start = end = ""
    try:
        with_reasoning = render([USER, {"role": "assistant", "content": ANSWER, "reasoning_content": THINKING}],
                                False, True)
        render([USER, {"role": "assistant", "content": ANSWER}], False, True)
        found = _around(with_reasoning) if THINKING in with_reasoning else None
        if found and found[1]:
            start, end = found
    except Exception:
        pass
    try:
        off, on = render([USER], True, False), render([USER], True, True)
        start, end = _thinking_switch(off, on, start, end)
    except Exception:
        pass
    if tool_calls:
        start, end = _reasoning_with_calls(render, start, end)
    if not (start or end) and "content.split('</think>')" in source and "reasoning_content" not in source \
            and "<SPECIAL_12>" not in source:        # old Qwen / DeepSeek templates (a llama.cpp workaround)
        start, end = "<think>", "</think>"
    if "Write your thoughts between <think></think> and write your response between " in source:
        start, end = "<think>", "</think>"           # Granite 3.3 (a llama.cpp workaround)
    if all(m in source for m in ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOL_RESPONSE>")):
        start, end = "<think>\n", "</think>"         # Nemotron Nano v2 (a llama.cpp workaround)
    if "laguna_glm_thinking" in source:              # Laguna (a llama.cpp workaround): bare tags
        start, end = start.strip(" \t\r\n"), end.strip(" \t\r\n")
    return Reasoning(start, end)


_ARGS = {"type": "object", "properties": {
    "AA_ARG_FST_AA": {"type": "string", "description": "First argument"},
    "BB_ARG_SND_BB": {"type": "string", "description": "Second argument"}}, "required": []}
_TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": _ARGS}}
          for n, d in (("FFF_FIRST_FUN_F", "Test function foo"), ("SSS_SECOND_FUN_S", "Test function bar"))]


def _reasoning_with_calls(render, start: str, end: str) -> tuple[str, str]:
    """A template that writes reasoning only beside tool calls (compare_reasoning_scope)."""
    call = {"id": "call00001", "type": "function", "function": {
        "name": "FFF_FIRST_FUN_F", "arguments": {"AA_ARG_FST_AA": "VVVV", "BB_ARG_SND_BB": "XXXX"}}}
    try:
        plain = render([USER, {"role": "assistant", "content": ANSWER, "reasoning_content": THINKING}],
                       False, True, _TOOLS)
        calls = render([USER, {"role": "assistant", "content": None, "reasoning_content": THINKING,
                               "tool_calls": [call]}], False, True, _TOOLS)
    except Exception:
        return start, end
    if THINKING in plain or THINKING not in calls:
        return start, end
    wrapped = re.search(f"({_MARKER}{_SPACE}){re.escape(THINKING)}{_SPACE}({_MARKER}{_SPACE})", calls)
    if wrapped:
        return wrapped.group(1), wrapped.group(2)
    after = re.search(f"{re.escape(THINKING)}{_SPACE}({_MARKER}{_SPACE})?", calls)
    return (start, after.group(1) or "") if after else ("", "")


def _thinking_switch(off: str, on: str, start: str, end: str) -> tuple[str, str]:
    """What enable_thinking changes in the generation prompt (compare_thinking_enabled)."""
    only_off, only_on = diff_split(off, on)
    off_t, on_t = only_off.strip(" \t\r\n"), only_on.strip(" \t\r\n")
    if not off_t and only_on:
        if on_t and on.endswith(on_t) and not start:
            start = only_on
    elif not on_t and only_off:
        if off_t and off.endswith(off_t) and not end:
            segs = [s for s in segments(off) if s.value.strip(" \t\r\n")]
            if len(segs) >= 2 and segs[-1].value == off_t and segs[-2].marker:
                start = segs[-2].value
            end = only_off
    elif off_t and on_t:
        for base, extended in ((on, off), (off, on)):
            anchor = base[-64:]
            pos = extended.rfind(anchor)
            if pos < 0 or pos + len(anchor) >= len(extended):
                continue
            extra = extended[pos + len(anchor):].strip(" \t\r\n")
            segs = [s for s in segments(extra) if s.value.strip(" \t\r\n")]
            if extra and len(segs) == 2 and segs[0].marker and segs[1].marker:
                start, end = start or segs[0].value, end or segs[1].value
                break
    return start, end


def continued(generation_prompt: str, content: str, reasoning_content: str, markers: Reasoning) -> str:
    """A continued assistant message as llama.cpp's autoparser writes it after the rest of the
    chat (chat-auto-parser-generator.cpp): the generation prompt up to the reasoning start
    marker, the marker and the reasoning, then, unless only reasoning is continued (it has
    no content), the end marker and the content."""
    reasoning_only = bool(reasoning_content) and not content
    text = generation_prompt
    if markers.start:
        i = text.find(markers.start)
        text = (text[:i] if i >= 0 else text) + markers.start + reasoning_content
        if not reasoning_only:
            text += markers.end
    return text if reasoning_only else text + content
