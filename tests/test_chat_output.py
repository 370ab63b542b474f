"""Tool-call and reasoning parsing (server/chat/output.py) on outputs written the way
each model family writes them; the format is detected from the real template
(tests/data/templates/, copied from llama.cpp's models/templates)."""
from __future__ import annotations

import json
import os

import pytest

from ggserve.server.chat import output as co

TEMPLATES = os.path.join(os.path.dirname(__file__), "data", "templates")
TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "opts": {"type": "object"}}}}}
    for n in ("get_weather", "get_time")]

NESTED = {"city": "Zürich 東京 🌧", "opts": {"units": ["C", "F"], "deep": {"a": [1, 2.5, None, True]}}}


def fmt_of(template: str) -> co.Format:
    with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
        return co.detect(f.read())(TOOLS)


def call(name, args):
    return (name, json.dumps(args, ensure_ascii=False, separators=(",", ":")))


# the families whose calls carry a JSON object: llama-server 11434 answers its text as written
# (tests/test_template_parsing.py); the others' arguments are built from their parameters, minified
JSON_ARGS = {"hermes", "qwen3", "llama3", "mistral", "deepseek_v3_1", "kimi_k2", "command_r7b"}


def call_of(family, name, args):
    return (name, json.dumps(args, ensure_ascii=False)) if family in JSON_ARGS else call(name, args)


# family -> (template, how one call is written, separator between parallel calls)
def hermes(name, args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'


def qwen3_coder(name, args):
    params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}\n</parameter>\n"
                     for k, v in args.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def llama3(name, args):
    return f'{{"name": "{name}", "parameters": {json.dumps(args, ensure_ascii=False)}}}'


def mistral(name, args):
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(args, ensure_ascii=False)}"


def glm(name, args):
    kv = "".join(f"<arg_key>{k}</arg_key>\n<arg_value>{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</arg_value>\n"
                 for k, v in args.items())
    return f"<tool_call>{name}\n{kv}</tool_call>"


def deepseek_v31(name, args):
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(args, ensure_ascii=False)}<｜tool▁call▁end｜>"


def kimi(name, args, i=0):
    return (f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>"
            f"{json.dumps(args, ensure_ascii=False)}<|tool_call_end|>")


def harmony(name, args):
    return (f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>"
            f"{json.dumps(args, ensure_ascii=False)}<|call|>")


def gemma4_value(v):
    if isinstance(v, str):
        return f'<|"|>{v}<|"|>'
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{gemma4_value(x)}" for k, x in sorted(v.items())) + "}"
    if isinstance(v, list):
        return "[" + ",".join(gemma4_value(x) for x in v) + "]"
    return json.dumps(v)


def gemma4(name, args):
    return f"<|tool_call>call:{name}{gemma4_value(args)}<tool_call|>"


def lfm2(name, args):       # as LFM2.5's template writes a call: strings quoted, the rest as JSON
    values = (f"'{v}'" if isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in args.values())
    return f"{name}(" + ", ".join(f"{k}={v}" for k, v in zip(args, values)) + ")"


def seed_oss(name, args):
    params = "".join(f"<parameter={k}>{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</parameter>\n"
                     for k, v in args.items())
    return f"<seed:tool_call>\n<function={name}>\n{params}</function>\n</seed:tool_call>"


def command_r7b(name, args):
    return json.dumps({"tool_call_id": "0", "tool_name": name, "parameters": args}, ensure_ascii=False)


def dsml(name, args):
    params = "".join(f'<｜DSML｜parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
                     f'{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</｜DSML｜parameter>\n'
                     for k, v in args.items())
    return f'<｜DSML｜invoke name="{name}">\n{params}</｜DSML｜invoke>'


FAMILIES = {
    "hermes": ("Qwen-Qwen2.5-7B-Instruct", hermes, "\n", "{}"),
    "qwen3": ("Qwen-Qwen3-0.6B", hermes, "\n", "{}"),
    "qwen3_coder": ("Qwen3-Coder", qwen3_coder, "\n", "{}"),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct", llama3, None, "{}"),
    "mistral": ("Mistral-Small-3.2-24B-Instruct-2506", mistral, "", "{}"),
    "glm": ("GLM-4.6", glm, "\n", "{}"),
    "deepseek_v3_1": ("deepseek-ai-DeepSeek-V3.1", deepseek_v31, "",
                      "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>"),
    "kimi_k2": ("moonshotai-Kimi-K2", kimi, "",
                "<|tool_calls_section_begin|>{}<|tool_calls_section_end|>"),
    "gemma4": ("google-gemma-4-31B-it", gemma4, "", "{}"),
    "lfm2": ("LFM2.5-8B-A1B", lfm2, ", ", "<|tool_call_start|>[{}]<|tool_call_end|>"),
    "seed_oss": ("ByteDance-Seed-OSS", seed_oss, "", "{}"),
    "command_r7b": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", command_r7b, ", ",
                    "<|START_ACTION|>[{}]<|END_ACTION|>"),
    "deepseek_v3_2": ("deepseek-ai-DeepSeek-V3.2", dsml, "\n",
                      "<｜DSML｜function_calls>\n{}\n</｜DSML｜function_calls>"),
}
# the families whose parser reads text after the calls as content (llama.cpp's others refuse it)
TEXT_AROUND = [f for f in FAMILIES if f not in ("llama3", "gemma4", "lfm2", "command_r7b", "deepseek_v3_2")]


@pytest.mark.parametrize("template,name", [
    ("Qwen-Qwen2.5-7B-Instruct", "hermes"), ("Qwen-Qwen3-0.6B", "hermes"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"), ("Qwen3-Coder", "qwen3_coder"),
    ("meta-llama-Llama-3.1-8B-Instruct", "llama3"), ("Mistral-Small-3.2-24B-Instruct-2506", "mistral"),
    ("mistralai-Mistral-Nemo-Instruct-2407", "mistral_nemo"), ("openai-gpt-oss-120b", "gpt_oss"),
    ("deepseek-ai-DeepSeek-V3.1", "deepseek_v3_1"), ("moonshotai-Kimi-K2", "kimi_k2"),
    ("GLM-4.6", "glm"), ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "deepseek_r1"),
    ("google-gemma-4-31B-it", "gemma4"), ("ByteDance-Seed-OSS", "seed_oss"), ("LFM2-8B-A1B", "lfm2"),
    ("LFM2.5-Instruct", "lfm2"), ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "command_r7b"),
    ("deepseek-ai-DeepSeek-V3.2", "deepseek_v3_2"), ("deepseek-ai-DeepSeek-V4", "deepseek_v4"),
    ("NVIDIA-Nemotron-Nano-v2", "nemotron_v2"), ("Kimi-K3", "kimi_k3"), ("MiniMax-M2", "minimax_m2"),
    ("MiniMax-M3", "minimax_m3"), ("inclusionai-ling-3.0-flash", "ling3"), ("tencent-Hy3", "hy3"),
    ("llm-jp-llm-jp-4.1-8b-thinking", "llm_jp_harmony"), ("muse-glimmer", "muse_glimmer"),
    ("meetkai-functionary-medium-v3.2", "functionary_v3_2"), ("meetkai-functionary-medium-v3.1", "functionary_v3_1"),
    ("GigaChat3-10B-A1.8B", "gigachat_3"), ("Cohere2MoE", "cohere2moe"), ("openbmb-MiniCPM5-1B", "minicpm5"),
])
def test_format_is_detected_from_the_template(template, name):
    assert fmt_of(template).name == name


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weath\\er", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weath\\er", "arguments": {"city": "Os',
])
def test_a_call_name_with_a_broken_escape_is_text_not_an_error(text):
    """Streamed one piece at a time or whole, the broken call stays text (no 500)."""
    out = co.ChatOutput(fmt_of("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"))
    streamed = "".join(out.feed(c).content for c in text) + out.finish().content
    assert (streamed, out.calls) == (text, [])


def test_template_without_tool_syntax_gets_the_generic_json_format():
    from ggserve.models.chat_template import CHATML

    assert co.detect(CHATML) is co.Generic
    p = co.parse('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', co.Generic(TOOLS))
    assert [(c.name, c.args) for c in p.calls] == [call("get_weather", {"city": "Paris"})]
    assert co.parse('{"response": "Hello"}', co.Generic(TOOLS)).content == "Hello"


def parsed_calls(p: co.Parsed):
    return [(c.name, c.args) for c in p.calls]


@pytest.mark.parametrize("family", FAMILIES)
def test_single_call(family):
    template, write, _, wrap = FAMILIES[family]
    p = co.parse(wrap.format(write("get_weather", {"city": "Paris"})), fmt_of(template))
    assert (p.content, parsed_calls(p)) == ("", [call_of(family, "get_weather", {"city": "Paris"})])


@pytest.mark.parametrize("family", [f for f in FAMILIES if FAMILIES[f][2] is not None])
def test_parallel_calls(family):
    template, write, sep, wrap = FAMILIES[family]
    text = wrap.format(write("get_weather", {"city": "Paris"}) + sep + write("get_time", {"city": "Oslo"}))
    p = co.parse(text, fmt_of(template))
    assert parsed_calls(p) == [call_of(family, "get_weather", {"city": "Paris"}),
                               call_of(family, "get_time", {"city": "Oslo"})]


@pytest.mark.parametrize("family", TEXT_AROUND)
def test_text_before_and_after_the_calls_is_content(family):
    template, write, _, wrap = FAMILIES[family]
    text = "Let me look that up.\n\n" + wrap.format(write("get_weather", {"city": "Paris"})) + "\nDone."
    p = co.parse(text, fmt_of(template))
    assert p.content == "Let me look that up.\n\nDone."     # as written before, stripped after
    assert parsed_calls(p) == [call_of(family, "get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("family", FAMILIES)
def test_nested_json_and_unicode_arguments(family):
    template, write, _, wrap = FAMILIES[family]
    p = co.parse(wrap.format(write("get_weather", NESTED)), fmt_of(template))
    assert [(n, json.loads(a)) for n, a in parsed_calls(p)] == [("get_weather", NESTED)]


@pytest.mark.parametrize("family", ["hermes", "llama3", "mistral", "deepseek_v3_1", "kimi_k2"])
def test_malformed_json_falls_back_to_content(family):
    template, write, _, wrap = FAMILIES[family]
    text = wrap.format(write("get_weather", {"city": "Paris"})).replace('"Paris"}', '"Paris",,}')
    p = co.parse(text, fmt_of(template))
    assert (p.content, p.calls) == (text, [])


def test_qwen3_think_block_is_reasoning():
    p = co.parse("<think>\nThe user wants weather.\n</think>\n\n" + hermes("get_weather", {"city": "Paris"}),
                 fmt_of("Qwen-Qwen3-0.6B"))
    # as llama-server: the reasoning keeps its trailing newline
    assert (p.reasoning, p.content) == ("The user wants weather.\n", "")
    assert parsed_calls(p) == [call_of("qwen3", "get_weather", {"city": "Paris"})]


def test_prompt_that_opened_the_think_block():
    p = co.parse("Short thought.</think>The answer is 4.", fmt_of("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"),
                 open_think=True)
    assert (p.reasoning, p.content) == ("Short thought.", "The answer is 4.")


def test_gemma4_thought_channel_is_reasoning():
    p = co.parse("<|channel>thought\nThe user wants weather.<channel|>" + gemma4("get_weather", {"city": "Paris"}),
                 fmt_of("google-gemma-4-31B-it"))
    assert (p.reasoning, p.content) == ("The user wants weather.", "")
    assert parsed_calls(p) == [call("get_weather", {"city": "Paris"})]


def test_gemma4_text_before_the_calls_is_content_as_written_and_text_after_them_is_dropped():
    # as llama-server's Gemma 4 parser, which ends at the last call
    text = " Let me look that up.\n" + gemma4("get_weather", {"city": "Paris"}) + "<|tool_"
    p = co.parse(text, fmt_of("google-gemma-4-31B-it"))
    assert (p.content, parsed_calls(p)) == (" Let me look that up.\n", [call("get_weather", {"city": "Paris"})])


def test_gemma4_string_keeps_json_specials_and_numbers_stay_numbers():
    p = co.parse(gemma4("get_weather", {"city": 'say "hi"\n{x:1}', "days": 3, "opts": {"on": True, "no": None}}),
                 fmt_of("google-gemma-4-31B-it"))
    assert [json.loads(a) for _, a in parsed_calls(p)] == [
        {"city": 'say "hi"\n{x:1}', "days": 3, "opts": {"no": None, "on": True}}]


def test_reasoning_format_none_keeps_think_in_content():
    text = "<think>hm</think>Hi"
    assert co.parse(text, fmt_of("Qwen-Qwen3-0.6B"), reasoning=False) == co.Parsed("", text)


def test_harmony_channels():
    text = ("<|channel|>analysis<|message|>Need the weather tool.<|end|>"
            + harmony("get_weather", {"city": "Paris"}).removesuffix("<|call|>"))
    p = co.parse(text, fmt_of("openai-gpt-oss-120b"))
    assert (p.reasoning, p.content) == ("Need the weather tool.", "")
    assert parsed_calls(p) == [("get_weather", '{"city": "Paris"}')]     # the message's JSON as written
    final = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    assert co.parse(final, fmt_of("openai-gpt-oss-120b")) == co.Parsed("Easy.", "Hello!")


def test_without_tools_markup_stays_content():
    text = hermes("get_weather", {"city": "Paris"})
    assert co.parse(text, fmt_of("Qwen-Qwen2.5-7B-Instruct"), tools=False).content == text


def stream(fmt, text, cut, **kw) -> tuple[str, str, list]:
    """Feed text in pieces cut at the given offsets; join the deltas."""
    out = co.ChatOutput(fmt, **kw)
    deltas = [out.feed(text[a:b]) for a, b in zip([0] + cut, cut + [len(text)])] + [out.finish()]
    calls: dict[int, list] = {}
    for d in deltas:
        for tc in d.tool_calls:
            if "id" in tc:
                assert tc["index"] not in calls and tc["function"]["name"]
                calls[tc["index"]] = [tc["function"]["name"], tc["function"]["arguments"]]
            else:
                calls[tc["index"]][1] += tc["function"]["arguments"]
    return ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas),
            [tuple(calls[i]) for i in sorted(calls)])


SPLIT_CASES = {
    "hermes": ("Qwen-Qwen3-0.6B", "<think>\nweather?\n</think>\n\nSure.\n" + hermes("get_weather", NESTED)
               + "\n" + hermes("get_time", {"city": "Oslo"})),
    "qwen3_coder": ("Qwen3-Coder", "ok\n" + qwen3_coder("get_weather", {"city": "Paris", "days": 3})),
    "llama3": ("meta-llama-Llama-3.1-8B-Instruct", llama3("get_weather", NESTED)),
    "mistral": ("Mistral-Small-3.2-24B-Instruct-2506", mistral("get_weather", NESTED) + mistral("get_time", {})),
    "glm": ("GLM-4.6", "<think>x</think>" + glm("get_weather", {"city": "Paris"})),
    "deepseek": ("deepseek-ai-DeepSeek-V3.1", "Hi<｜tool▁calls▁begin｜>" + deepseek_v31("get_weather", NESTED)
                 + "<｜tool▁calls▁end｜>"),
    "kimi": ("moonshotai-Kimi-K2", "<|tool_calls_section_begin|>" + kimi("get_weather", NESTED)
             + kimi("get_time", {"city": "Oslo"}, 1) + "<|tool_calls_section_end|>"),
    "gemma4": ("google-gemma-4-31B-it", "<|channel>thought\nWeather.<channel|>Sure." + gemma4("get_weather", NESTED)
               + gemma4("get_time", {"city": "Oslo", "days": -2.5e3})),
    "harmony": ("openai-gpt-oss-120b", "<|channel|>analysis<|message|>Think.<|end|>"
                + harmony("get_weather", NESTED).removesuffix("<|call|>")),
    "lfm2": ("LFM2.5-8B-A1B", "Sure. <|tool_call_start|>[" + lfm2("get_weather", NESTED) + ", "
             + lfm2("get_time", {"city": "O'slo", "days": 3}).replace("'O'slo'", "\"O'slo\"") + "]<|tool_call_end|>"),
    "seed_oss": ("ByteDance-Seed-OSS", "<seed:think>x</seed:think>" + seed_oss("get_weather", NESTED)),
    "command_r7b": ("CohereForAI-c4ai-command-r7b-12-2024-tool_use",
                    "<|START_ACTION|>[" + command_r7b("get_weather", NESTED) + "]<|END_ACTION|>"),
    "deepseek_v3_2": ("deepseek-ai-DeepSeek-V3.2", "Hi\n\n<｜DSML｜function_calls>\n" + dsml("get_weather", NESTED)
                      + "\n</｜DSML｜function_calls>"),
}


@pytest.mark.parametrize("case", SPLIT_CASES)
def test_stream_split_at_every_boundary_reassembles_to_the_whole(case):
    template, text = SPLIT_CASES[case]
    fmt = fmt_of(template)
    whole = co.parse(text, fmt)
    want = (whole.reasoning, whole.content, [(c.name, c.args) for c in whole.calls])
    assert want[2], "the case must have calls"
    for i in range(1, len(text)):
        assert stream(fmt, text, [i]) == want, f"split at {i}"
    assert stream(fmt, text, list(range(1, len(text)))) == want     # one character at a time


def test_stream_never_shows_a_partial_name_or_marker():
    fmt = fmt_of("Qwen-Qwen2.5-7B-Instruct")
    out = co.ChatOutput(fmt)
    text = "Hi " + hermes("get_weather", {"city": "Paris"})
    seen = []
    for ch in text:
        d = out.feed(ch)
        seen += [tc["function"].get("name") for tc in d.tool_calls if "id" in tc]
        assert "<" not in d.content
    assert seen == ["get_weather"]
