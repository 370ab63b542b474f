"""A continued final assistant message (a prefill) -> the text the output parser reads before
the generated text, as llama-server 11434 builds it: each family's parser (common/parsers/*.cpp)
and its autoparser (chat-auto-parser-generator.cpp) write the message back in the family's own
syntax, its reasoning block (even empty) then its answer, and parse that with what the model
writes. So a whole tool call written as the prefill comes back as a call, the message's
reasoning_content as reasoning, and where the family writes the answer in a channel of its
own (Harmony's final channel, Functionary v3.2's `all`, Cohere2's text block) as content."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prefill:
    """The final assistant message a chat continues: its text and its reasoning_content."""
    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


_HARMONY = ("<|channel|>analysis<|message|>", "<|end|><|start|>assistant<|channel|>final<|message|>")
# (reasoning start, reasoning end + answer start) per family with a parser of its own; the
# generation prompt's own text (the role header) is in the prompt already
_WRAPS = {
    "gpt_oss": _HARMONY,
    "llm_jp_harmony": _HARMONY,
    "muse_glimmer": (" to=self<|message|>", "<|eom|><|start|>assistant to=user<|message|>"),
    "cohere2moe": ("<|START_THINKING|>", "<|END_THINKING|><|START_TEXT|>"),
    "kimi_k3": ("<|open|>think<|sep|>", "<|close|>think<|sep|><|open|>response<|sep|>"),
    "minicpm5": ("<think>\n", "\n</think>\n\n"),
    "gemma4": ("<|channel>thought\n", "<channel|>"),
    "lfm2": ("<think>", "</think>"),
}
# families that write no reasoning block before a continued answer
_ANSWER_ONLY = {"functionary_v3_2": "all\n", "gigachat_3": ""}


def parsed_text(fmt, prefill: Prefill) -> tuple[str, bool]:
    """(the text parsed before the generated text, whether reasoning is split off in it)."""
    r, c = prefill.reasoning, prefill.content
    if fmt.name in _ANSWER_ONLY:
        return _ANSWER_ONLY[fmt.name] + c, True
    if fmt.name in _WRAPS:
        start, end = _WRAPS[fmt.name]
        return start + r + end + c, True
    if fmt.name == "deepseek_v4" and not r:
        return "</think>" + c, True      # V4 continues an answer without reasoning after the bare end
    if fmt.name == "qwen3_coder":
        return ("<think>\n" + r + "\n</think>\n\n" if fmt.reasoning_template else "") + c, True
    if fmt.autoparse is not None:
        return fmt.autoparse[0] + r + fmt.autoparse[1] + c, True
    if fmt.reasoning_template and fmt.think[0] and fmt.think[1]:
        return fmt.think[0] + r + fmt.think[1] + c, True
    return c, False
