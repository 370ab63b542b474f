"""The template families llama.cpp 11434 renders with a handler of their own instead of its
autoparser (common/chat.cpp, common_chat_try_specialized_template; common/parsers/*.cpp),
found by the same markers in the same order: whether the family "supports thinking"
(llama-server's default enable_thinking), how a continued assistant message is written,
and what the handler changes in the messages it renders.

A continued message (an assistant prefill) is the chat without a generation prompt, then
the family's own opening, the reasoning, and, when content is continued, the close of the
reasoning and the content.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field


def _thinking_field(msgs: list[dict], drop_content_with_calls: bool = False) -> list[dict]:
    """reasoning_content copied to `thinking`, the field gpt-oss's and LFM2's templates read."""
    out = []
    for m in msgs:
        if isinstance(m.get("reasoning_content"), str):
            m = {**m, "thinking": m["reasoning_content"]}
            if drop_content_with_calls and m.get("tool_calls"):
                m = {k: v for k, v in m.items() if k != "content"}
        out.append(m)
    return out


@dataclass(frozen=True)
class Family:
    name: str
    thinking: bool | None = None      # None: as the autoparser's analysis finds
    # (generation prompt, rendered chat, content, reasoning, content continued) -> what follows the chat
    continuation: Callable | None = None
    messages: Callable = field(default=lambda msgs: msgs)


def _fixed(opening: str, think_start: str, think_end: str = "", between: str = "") -> Callable:
    """opening + think_start + reasoning [+ think_end + between + content]."""
    def write(gen, prompt, content, reasoning, with_content):
        text = opening + think_start + reasoning
        return text + think_end + between + content if with_content else text
    return write


def _content_only(opening: str) -> Callable:
    return lambda gen, prompt, content, reasoning, with_content: opening + (content if with_content else "")


def _from_generation_prompt(think_start: str, think_end: str) -> Callable:
    return lambda gen, prompt, content, reasoning, with_content: \
        gen + think_start + reasoning + (think_end + content if with_content else "")


def _deepseek(v4: bool) -> Callable:
    def write(gen, prompt, content, reasoning, with_content):
        if v4 and not reasoning:
            return "<｜Assistant｜></think>" + (content if with_content else "")
        return "<｜Assistant｜><think>" + reasoning + ("</think>" + content if with_content else "")
    return write


def _tool_results_in_call_order(msgs: list[dict]) -> list[dict]:
    """DeepSeek V4 renders a run of user/tool messages as one user block with the results in
    the order of the calls before them, matched by id (llama.cpp's deepseek_v4_sort_tool_results;
    a result whose id matches no call counts as the first call's; equal ones keep their order)."""
    out, order, i = list(msgs), {}, 0
    while i < len(out):
        m = out[i]
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            order = {c["id"]: k for k, c in enumerate(m["tool_calls"]) if isinstance(c, dict) and c.get("id")}
            i += 1
            continue
        if role not in ("user", "tool"):
            i += 1
            continue
        end = i
        while end < len(out) and out[end].get("role") in ("user", "tool"):
            end += 1
        where = [k for k in range(i, end) if out[k].get("role") == "tool"]
        if len(where) > 1 and order:
            results = sorted((out[k] for k in where), key=lambda r: order.get(r.get("tool_call_id", ""), 0))
            for k, r in zip(where, results):
                out[k] = r
        i = end
    return out


def _gemma4_tool_responses(msgs: list[dict]) -> list[dict]:
    """Older Gemma 4 templates read results from the assistant turn: each assistant message
    with calls, the tool messages after it (as `tool_responses`, JSON parsed where it parses)
    and a final assistant text become one message (llama.cpp's convert_tool_responses_gemma4)."""
    out, i = [], 0
    while i < len(msgs):
        m = msgs[i]
        if m.get("role") != "assistant" or not m.get("tool_calls"):
            out.append(m)
            i += 1
            continue
        calls, responses = list(m["tool_calls"]), []
        i += 1
        while i < len(msgs) and msgs[i].get("role") == "tool":
            responses.append(_tool_response(msgs[i], calls, len(responses)))
            i += 1
        turn = {"role": "assistant", "tool_calls": calls}
        if responses:
            turn["tool_responses"] = responses
        nxt = msgs[i] if i < len(msgs) else None
        if nxt is not None and nxt.get("role") == "assistant" and not nxt.get("tool_calls") and nxt.get("content"):
            turn["content"] = nxt["content"]
            i += 1
        if isinstance(m.get("reasoning_content"), str):
            turn["reasoning_content"] = m["reasoning_content"]
        out.append(turn)
    return out


def _tool_response(msg: dict, calls: list, index: int) -> dict:
    response = msg.get("content")
    if isinstance(response, str):
        try:
            response = json.loads(response)
        except ValueError:
            pass
    fn = calls[index].get("function") if index < len(calls) and isinstance(calls[index], dict) else None
    name = (fn or {}).get("name") or msg.get("tool_call_id", "")
    return {"name": name, "response": response}


def _gemma4(gen, prompt, content, reasoning, with_content):
    text = ("<|turn>model\n" if prompt.endswith("<turn|>\n") else "") + "<|channel>thought\n" + reasoning
    return text + "<channel|>" + content if with_content else text


def _qwen3_coder(thinks: bool) -> Callable:
    def write(gen, prompt, content, reasoning, with_content):
        text = "<|im_start|>assistant\n"
        if thinks:
            text += "<think>\n" + reasoning + ("\n</think>\n\n" if with_content else "")
        return text + content if with_content else text
    return write


_HARMONY = _fixed("<|start|>assistant<|channel|>analysis<|message|>", "",
                  "<|end|><|start|>assistant<|channel|>final<|message|>")


def family(src: str) -> Family | None:
    """The specialized family of a template source, or None (llama.cpp's autoparser)."""
    has = src.__contains__
    if has("[SYSTEM_PROMPT]") and has("[TOOL_CALLS]") and has("[ARGS]") and not has("[CALL_ID]"):
        return Family("ministral_3", True)        # written by models/chat_template.py itself
    if has("chat_format=llm-jp-harmony-v1"):
        return Family("llm_jp_harmony", True, _HARMONY, _thinking_field)
    if has("<|channel|>"):
        return Family("gpt_oss", True, _HARMONY, lambda m: _thinking_field(m, drop_content_with_calls=True))
    if has("<atem:function_calls>") and has("<|eom|>"):
        return Family("muse_glimmer", True, _fixed("<|start|>assistant to=self<|message|>", "",
                                                   "<|eom|><|start|>assistant to=user<|message|>"))
    if has(">>>all") and has(">>>${recipient}"):
        return Family("functionary_v3_2", False,
                      _content_only("<|start_header_id|>assistant<|end_header_id|>\n\n>>>all\n"))
    if has("<|tool_calls_section_begin|>") and has("<|tool_call_begin|>"):
        return Family("kimi_k2", True, _fixed("<|im_assistant|>assistant<|im_middle|>", "<think>", "</think>"))
    if has("<|open|>") and has("<|close|>") and has("<|end_of_msg|>"):
        return Family("kimi_k3", True, _fixed('<|open|>message role="assistant"<|sep|>', "<|open|>think<|sep|>",
                                              "<|close|>think<|sep|>", "<|open|>response<|sep|>"))
    if has("<role>ASSISTANT</role>") and has("<arg_key>"):
        return Family("ling3", True, _fixed("<role>ASSISTANT</role>\n", "<think>", "</think>"))
    if has("<|START_TEXT|>") and has("<|START_ACTION|>"):
        return Family("cohere2moe", True, _fixed("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|START_THINKING|>",
                                                 "<|END_THINKING|>", "<|START_TEXT|>"))
    if (has("<|tool_list_start|>") and has("<|tool_list_end|>")) or \
            (has("List of tools: [") and not has("<|tool_list_start|>")):
        return Family("lfm2", True, _fixed("<|im_start|>assistant\n", "<think>", "</think>"), _thinking_field)
    if has("<|role_sep|>") and has("<|message_sep|>") and not has("<|function_call|>"):
        return Family("gigachat_v3", False, _content_only("assistant<|role_sep|>\n"))
    if has("]<]minimax[>[") and has("<tool_call>") and has("<invoke name="):
        return Family("minimax_m3", True, _from_generation_prompt("<mm:think>", "</mm:think>"))
    if has("dsml_token") and has("DSML") and (has("function_calls") or has("tool_calls")):
        if has("function_calls"):
            return Family("deepseek_v3_2", True, _deepseek(v4=False))
        return Family("deepseek_v3_2", True, _deepseek(v4=True), _tool_results_in_call_order)
    if has("'<|tool_call>call:'"):
        if has("{#- OpenAI Chat Completions:"):
            return Family("gemma4", True, _gemma4)
        return Family("gemma4", True, _gemma4, _gemma4_tool_responses)
    if has("Tool usage guidelines:") and has('<function name="') and has('<param name="'):
        return Family("minicpm5", True, _fixed("<|im_start|>assistant\n<think>\n", "", "\n</think>\n\n"))
    if has("<tool_call>") and has("<function=") and has("<parameter=") \
            and not has("'<tool_call><function=' ~ tool_call.name ~ '>'"):
        return Family("qwen3_coder", has("<think>"), _qwen3_coder(has("<think>")))
    return None
