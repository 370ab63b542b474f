"""Whole tool calls written in each family's own syntax, for record.py's "whole_call" kind: the
text goes to llama-server as the final assistant message (a prefill) and SmolLM2's EOS is forced
(logit_bias), so what llama-server parses is exactly this text.

Each text is the call part of the family's assistant tool-call turn as its template renders it
(a conversation with that call rendered as llama-server's /apply-template renders it,
tests/data/template_renderings/): what the template writes for the message's tool_calls, without
the end-of-turn marker and without the reasoning block it writes before them (llama-server renders
the final assistant message's reasoning_content itself; record.py sends one as a think block).
Per template: (one call, two parallel calls or None where the template writes one call per turn).
SmolLM3 and Granite 3.3 are left out: their templates write no call syntax.
"""
from __future__ import annotations

_OSLO = '{"city": "Oslo"}'
_ADD = '{"a": 2, "b": 3}'


def _hermes(sep: str = "\n") -> tuple[str, str]:
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    return one, one + sep + '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


_H1, _H2 = _hermes()
_DS31 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>" + _OSLO + "<｜tool▁call▁end｜>",
         "<｜tool▁call▁begin｜>add<｜tool▁sep｜>" + _ADD + "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
_R1 = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n" + _OSLO
       + "\n```<｜tool▁call▁end｜>", "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>add\n```json\n" + _ADD
       + "\n```<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
_GLM46 = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
          "\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>b</arg_key>\n"
          "<arg_value>3</arg_value>\n</tool_call>")
_GLM47 = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
          "<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>b</arg_key><arg_value>3</arg_value>"
          "</tool_call>")
_SEED = ("<seed:tool_call>\n<function=get_weather>\n<parameter=city>Oslo</parameter>\n</function>\n</seed:tool_call>",
         "\n<seed:tool_call>\n<function=add>\n<parameter=a>2</parameter>\n<parameter=b>3</parameter>\n</function>\n"
         "</seed:tool_call>")
_COHERE = ('<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": ' + _OSLO + '}',
           ',\n    {"tool_call_id": "1", "tool_name": "add", "parameters": ' + _ADD + '}', "\n]<|END_ACTION|>")
_RPLUS = ('Action:\n```json\n[\n    {\n        "tool_name": "get_weather",\n        "parameters": {\n'
          '            "city": "Oslo"\n        }\n    }',
          ',\n    {\n        "tool_name": "add",\n        "parameters": {\n            "a": 2,\n            "b": 3\n'
          '        }\n    }', "\n]```")
_NEMO2 = ('<TOOLCALL>[{"name": "get_weather", "arguments": ' + _OSLO + "}",
          ', {"name": "add", "arguments": ' + _ADD + "}", "]</TOOLCALL>")
_MISTRAL = ("[TOOL_CALLS]get_weather[ARGS]" + _OSLO, "[TOOL_CALLS]add[ARGS]" + _ADD)
_NEMO = ('[TOOL_CALLS][{"name": "get_weather", "arguments": ' + _OSLO + "}",
         ', {"name": "add", "arguments": ' + _ADD + "}", "]")
_FIRE = (' functools[{"name": "get_weather", "arguments": ' + _OSLO + "}", ', {"name": "add", "arguments": '
         + _ADD + "}", "]")
_F31 = ("<function=get_weather>" + _OSLO + "</function>", "<function=add>" + _ADD + "</function>")
_APERTUS = ('<|tools_prefix|>[{"get_weather": ' + _OSLO + "}", ', {"add": ' + _ADD + "}", "]<|tools_suffix|>")
_APRIEL = ('<tool_calls>[{"name": "get_weather", "arguments": ' + _OSLO + "}",
           ', {"name": "add", "arguments": ' + _ADD + "}", "]</tool_calls>")
_MM2 = ('<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Oslo</parameter>\n</invoke>\n',
        '<invoke name="add">\n<parameter name="a">2</parameter>\n<parameter name="b">3</parameter>\n</invoke>\n',
        "</minimax:tool_call>")
_HY3 = ("<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n"
        "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Oslo</arg_value:opensource>\n"
        "</tool_call:opensource>\n", "<tool_call:opensource>add<tool_sep:opensource>\n<arg_key:opensource>a"
        "</arg_key:opensource>\n<arg_value:opensource>2</arg_value:opensource>\n<arg_key:opensource>b"
        "</arg_key:opensource>\n<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n",
        "</tool_calls:opensource>")
_LLMJP = (' to=functions.get_weather<|channel|>commentary <|constrain|> json<|message|>' + _OSLO,
          '<|end|><|start|>assistant to=functions.add<|channel|>commentary <|constrain|> json<|message|>' + _ADD)
_OSS = (' to=functions.get_weather<|channel|>commentary json<|message|>' + _OSLO,
        '<|call|><|start|>assistant to=functions.add<|channel|>commentary json<|message|>' + _ADD)
_MUSE = (' to=get_weather<|message|><atem:function_calls>\n<atem:invoke name="get_weather">\n'
         '<atem:parameter name="city">Oslo</atem:parameter>\n</atem:invoke>\n</atem:function_calls>',
         '<|eom|><|start|>assistant to=add<|message|><atem:function_calls>\n<atem:invoke name="add">\n'
         '<atem:parameter name="a">2</atem:parameter>\n<atem:parameter name="b">3</atem:parameter>\n'
         '</atem:invoke>\n</atem:function_calls>')
_KIMI = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" + _OSLO
         + "<|tool_call_end|>", "<|tool_call_begin|>functions.add:1<|tool_call_argument_begin|>" + _ADD
         + "<|tool_call_end|>", "<|tool_calls_section_end|>")
_K3 = ('<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|><|open|>argument key="city" '
       'type="string"<|sep|>Oslo<|close|>argument<|sep|><|close|>call<|sep|>',
       '<|open|>call tool="add" index="2"<|sep|><|open|>argument key="a" type="number"<|sep|>2<|close|>argument'
       '<|sep|><|open|>argument key="b" type="number"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|>',
       "<|close|>tools<|sep|>")
_LING = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
         "\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value><arg_key>b</arg_key>\n"
         "<arg_value>3</arg_value>\n</tool_call>")
_LFM = ('<|tool_call_start|>[get_weather(city="Oslo")', ", add(a=2, b=3)", "]<|tool_call_end|>")
_MM3 = (']<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>Oslo]<]minimax[>['
        '</city>]<]minimax[>[</invoke>\n', ']<]minimax[>[<invoke name="add">]<]minimax[>[<a>2]<]minimax[>[</a>]'
        '<]minimax[>[<b>3]<]minimax[>[</b>]<]minimax[>[</invoke>\n', "]<]minimax[>[</tool_call>")


def _dsml(section: str) -> tuple[str, str, str]:
    return (f'<｜DSML｜{section}>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" '
            'string="true">Oslo</｜DSML｜parameter>\n</｜DSML｜invoke>\n',
            '<｜DSML｜invoke name="add">\n<｜DSML｜parameter name="a" string="false">2</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="b" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n',
            f"</｜DSML｜{section}>")


_GEMMA4 = ('<|tool_call>call:get_weather{city:<|"|>Oslo<|"|>}<tool_call|>', "<|tool_call>call:add{a:2,b:3}<tool_call|>")
_CPM5 = ('<function name="get_weather"><param name="city">Oslo</param></function>',
         '\n<function name="add"><param name="a">2</param><param name="b">3</param></function>')
_CODER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>",
          "\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n"
          "</function>\n</tool_call>")


def _section(parts: tuple[str, str, str]) -> tuple[str, str]:
    """(first call + end, first + second call + end) of a section that wraps its calls."""
    first, second, end = parts
    return first + end, first + second + end


def _pair(parts: tuple[str, str]) -> tuple[str, str]:
    return parts[0], parts[0] + parts[1]


WHOLE_CALLS: dict[str, tuple[str, str | None]] = {
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": (_H1, _H2),
    "Qwen-Qwen2.5-7B-Instruct": (_H1, _H2),
    "meta-llama-Llama-3.1-8B-Instruct": ('{"name": "get_weather", "parameters": ' + _OSLO + "}", None),
    "Qwen-Qwen3-0.6B": (_H1, _H2),
    "deepseek-ai-DeepSeek-V3.1": _section(_DS31),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": _section(_R1),
    "GLM-4.6": _pair(_GLM46),
    "GLM-4.7-Flash": _pair(_GLM47),
    "ibm-granite-granite-4.0": (_H1, _H2),
    "ByteDance-Seed-OSS": _pair(_SEED),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": _section(_COHERE),
    "CohereForAI-c4ai-command-r-plus-tool_use": _section(_RPLUS),
    "NVIDIA-Nemotron-Nano-v2": _section(_NEMO2),
    "Mistral-Small-3.2-24B-Instruct-2506": _pair(_MISTRAL),
    "mistralai-Mistral-Nemo-Instruct-2407": _section(_NEMO),
    "fireworks-ai-llama-3-firefunction-v2": _section(_FIRE),
    "meetkai-functionary-medium-v3.1": _pair(_F31),
    "Apertus-8B-Instruct": _section(_APERTUS),
    "Apriel-1.6-15b-Thinker-fixed": _section(_APRIEL),
    "MiniMax-M2": _section(_MM2),
    "GigaChat3.1-10B-A1.8B": ('<|function_call|>{"name": "get_weather", "arguments": ' + _OSLO + "}", None),
    "tencent-Hy3": _section(_HY3),
    "mistralai-Ministral-3-14B-Reasoning-2512": _pair(_MISTRAL),
    "llm-jp-llm-jp-4.1-8b-thinking": _pair(_LLMJP),
    "openai-gpt-oss-120b": _pair(_OSS),
    "muse-glimmer": _pair(_MUSE),
    "meetkai-functionary-medium-v3.2": ("get_weather\n" + _OSLO, "get_weather\n" + _OSLO + ">>>add\n" + _ADD),
    "Kimi-K2-Thinking": _section(_KIMI),
    "Kimi-K3": _section(_K3),
    "inclusionai-ling-3.0-flash": _pair(_LING),
    "Cohere2MoE": _section(_COHERE),
    "LFM2-8B-A1B": _section(_LFM),
    "LFM2.5-Instruct": _section(_LFM),
    "GigaChat3-10B-A1.8B": ('<|message_sep|>\n\nfunction call<|role_sep|>\n{"name": "get_weather", "arguments": '
                            + _OSLO + "}", None),
    "MiniMax-M3": _section(_MM3),
    "deepseek-ai-DeepSeek-V3.2": _section(_dsml("function_calls")),
    "deepseek-ai-DeepSeek-V4": _section(_dsml("tool_calls")),
    "google-gemma-4-31B-it": _pair(_GEMMA4),
    "openbmb-MiniCPM5-1B": _pair(_CPM5),
    "Qwen3-Coder": _pair(_CODER),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": _pair(_CODER),
}
