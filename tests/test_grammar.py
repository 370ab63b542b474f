"""Constrained decoding (server/chat/grammar.py) on real vocabularies, and the grammar's
mask inside the batched sampler (server/engine/sampling/sampler.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from ggserve.models.chat_template import ChatTemplate
from ggserve.models.tokenizer.tokenizer import Tokenizer
from ggserve.server.api import schemas as S
from ggserve.server.app import ServerConfig
from ggserve.server.chat import output as co
from ggserve.server.chat.grammar import GrammarError, Grammars
from ggserve.server.chat.options import chat_options, compile_grammar
from ggserve.server.chat.tools.grammar import tool_call_lark
from ggserve.server.engine.sampling.sampler import SamplingParams, SequenceSampler, sample_batch

SYNTH = "/work/shared/golden/synth/models"
if not os.path.isdir(SYNTH):
    SYNTH = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "golden", "synth", "models")
TEMPLATES = os.path.join(os.path.dirname(__file__), "data", "templates")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}}]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    tok = Tokenizer.from_gguf(smollm2_path)
    return tok, Grammars(tok)


def test_invalid_json_schema_is_refused_with_the_reason(smollm2):
    _, g = smollm2
    with pytest.raises(GrammarError, match="nope"):
        g.compile("json_schema", {"type": "nope"})


def test_invalid_gbnf_is_refused(smollm2):
    _, g = smollm2
    with pytest.raises(GrammarError):
        g.compile("gbnf", 'root ::= ("a" | ')


def walk(tok, grammar, max_tokens=200) -> list[int]:
    """Generate as a 'model' that likes closing quotes and brackets, within the mask."""
    c = grammar.matcher()
    order = [b'"', b"}", b"]", b",", b":"]
    closers = sorted((i for i in range(tok.n_vocab) if tok.token_bytes(i) in order),
                     key=lambda i: order.index(tok.token_bytes(i)))
    out = []
    for _ in range(max_tokens):
        allowed = ~c.banned()
        if any(allowed[i] for i in tok.eog_ids if i < allowed.size):
            return out
        pick = next((i for i in closers if allowed[i]), None)
        t = int(pick if pick is not None else np.flatnonzero(allowed)[0])
        out.append(t)
        c.accept(t)
    raise AssertionError("the grammar never allowed the end")


def test_json_schema_walk_gives_valid_json(smollm2):
    tok, g = smollm2
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}, "s": {"type": "string"}},
              "required": ["n", "s"], "additionalProperties": False}
    obj = json.loads(tok.decode(walk(tok, g.compile("json_schema", schema))))
    assert set(obj) == {"n", "s"} and obj["n"] >= 1


@pytest.mark.parametrize("model,template", [
    ("synth-qwen3-q8_0.gguf", "Qwen-Qwen3-0.6B"),
    ("synth-gpt-oss-mxfp4_moe.gguf", "openai-gpt-oss-120b"),
    ("synth-mistral3-q8_0.gguf", "Mistral-Small-3.2-24B-Instruct-2506"),
    (None, "meta-llama-Llama-3.1-8B-Instruct"),
    (None, "mistralai-Mistral-Nemo-Instruct-2407"),
    (None, "deepseek-ai-DeepSeek-V3.1"),
    (None, "moonshotai-Kimi-K2"),
    (None, "ByteDance-Seed-OSS"),
    (None, "CohereForAI-c4ai-command-r7b-12-2024-tool_use"),
    (None, "Apertus-8B-Instruct"),
    (None, "NVIDIA-Nemotron-Nano-v2"),
    (None, "MiniMax-M2"),
    (None, "MiniMax-M3"),
    (None, "tencent-Hy3"),
    (None, "openbmb-MiniCPM5-1B"),
    (None, "deepseek-ai-DeepSeek-V3.2"),
    (None, "deepseek-ai-DeepSeek-V4"),
    (None, "LFM2.5-Instruct"),
    (None, "meetkai-functionary-medium-v3.1"),
    (None, "inclusionai-ling-3.0-flash"),
    (None, "Cohere2MoE"),
    (None, "GigaChat3-10B-A1.8B"),
    (None, "llm-jp-llm-jp-4.1-8b-thinking"),
    (None, "meetkai-functionary-medium-v3.2"),
])
def test_forced_tool_call_parses_as_the_named_call(smollm2, model, template):
    """Whatever the model picks within the mask, the parser reads the named tool's call."""
    if model is None:
        tok, g = smollm2
    else:
        path = os.path.join(SYNTH, model)
        if not os.path.exists(path):
            pytest.skip("synthetic models not here")
        tok = Tokenizer.from_gguf(path)
        g = Grammars(tok)
    with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
        fmt = co.detect(f.read())(TOOLS)
    grammar = g.compile("lark", tool_call_lark(g, fmt, ["add"], parallel=False))
    shown = co.shown_tokens(tok, fmt)
    text = b"".join(tok.token_bytes(t, special=t in shown) for t in walk(tok, grammar)).decode()
    [c] = co.parse(text, fmt).calls
    assert c.name == "add" and set(json.loads(c.args)) == {"a", "b"}


def test_mask_applies_to_the_grammar_row_only(smollm2):
    tok, g = smollm2
    grammar = g.compile("gbnf", 'root ::= "yes" | "no"')
    yes, no = tok.encode("yes", add_special=False)[0], tok.encode("no", add_special=False)[0]
    logits = np.zeros((2, tok.n_vocab), dtype=np.float32)
    logits[:, 42] = 10.0           # the favourite, which the grammar does not allow
    logits[:, no] = 1.0
    free = SequenceSampler(SamplingParams(temperature=0))
    bound = SequenceSampler(SamplingParams(temperature=0, grammar=grammar))
    assert [r.token for r in sample_batch(logits, [free, bound])] == [42, no]
    bound.accept(no)
    # after "no" only the end of generation is allowed
    assert not bound.constraint.banned()[tok.eos_id]
    assert yes != no


def test_a_draw_the_grammar_takes_is_the_free_draw(smollm2):
    """llama.cpp's rejection sampling: the token is first drawn from the row without the
    grammar; when the grammar takes it, that draw stands (one RNG draw, no mask needed)."""
    tok, g = smollm2
    grammar = g.compile("gbnf", 'root ::= [a-z]+')
    letters = [t for t in range(tok.n_vocab) if tok.token_bytes(t).isalpha() and tok.token_bytes(t).islower()]
    logits = np.full((1, tok.n_vocab), -40.0, dtype=np.float32)
    logits[0, letters[:50]] = np.linspace(2.0, 3.0, 50)         # the likely tokens are all allowed
    params = dict(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, seed=7)
    free, bound = SequenceSampler(SamplingParams(**params)), SequenceSampler(SamplingParams(**params, grammar=grammar))
    for _ in range(5):
        a, b = sample_batch(logits, [free])[0].token, sample_batch(logits, [bound])[0].token
        assert a == b and a in letters
        free.accept(a)
        bound.accept(b)


def test_a_refused_draw_is_drawn_again_from_the_masked_row(smollm2):
    """When the grammar refuses the free draw, the row is masked and a second draw (the RNG's
    next value) picks among the tokens it allows, as llama.cpp's common_sampler_sample."""
    tok, g = smollm2
    grammar = g.compile("gbnf", 'root ::= "yes" | "no"')
    yes, no = tok.encode("yes", add_special=False)[0], tok.encode("no", add_special=False)[0]
    logits = np.zeros((1, tok.n_vocab), dtype=np.float32)
    logits[0, 42], logits[0, yes], logits[0, no] = 20.0, 1.0, 1.0    # 42 is drawn, and refused
    params = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=3)
    bound = SequenceSampler(SamplingParams(**params, grammar=grammar))
    token = sample_batch(logits, [bound])[0].token
    # what a sampler that skips the first value and draws from the masked row gets
    masked = np.full_like(logits, -np.inf)
    masked[0, [yes, no]] = 1.0
    twin = SequenceSampler(SamplingParams(**params))
    twin.rng.random()
    assert token in (yes, no) and token == sample_batch(masked, [twin])[0].token


def _accepts(tok, grammar, text: str) -> bool:
    """Whether the grammar lets a model write exactly `text` (control tokens as
    themselves) and then stop."""
    c = grammar.matcher()
    for t in tok.encode(text, add_special=False, parse_special=True):
        if c.banned()[t]:
            return False
        c.accept(t)
    return any(not c.banned()[i] for i in tok.eog_ids if i < tok.n_vocab)


# a call to get_weather(city="Paris, 東京") as each template's model writes it
NAMED_PARAM_CALLS = {
    "Qwen3-Coder": (None, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, 東京\n</parameter>\n"
                          "</function>\n</tool_call>"),
    "GLM-4.6": (None, "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris, 東京</arg_value>\n"
                      "</tool_call>"),
    "google-gemma-4-31B-it": ("synth-gemma4-q8_0.gguf", '<|tool_call>call:get_weather{city:<|"|>Paris, 東京<|"|>}'
                                                        "<tool_call|>"),
    "MiniMax-M2": (None, '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris, 東京'
                         '</parameter>\n</invoke>\n</minimax:tool_call>'),
    "openbmb-MiniCPM5-1B": (None, '<function name="get_weather"><param name="city">Paris, 東京</param></function>'),
    "tencent-Hy3": (None, "<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>"
                          "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Paris, 東京"
                          "</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>"),
    "MiniMax-M3": (None, ']<]minimax[>[<tool_call>]<]minimax[>[<invoke name="get_weather">]<]minimax[>[<city>'
                         "Paris, 東京]<]minimax[>[</city>]<]minimax[>[</invoke>]<]minimax[>[</tool_call>"),
    "deepseek-ai-DeepSeek-V3.2": (None, '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
                                        '<｜DSML｜parameter name="city" string="true">Paris, 東京</｜DSML｜parameter>\n'
                                        "</｜DSML｜invoke>\n</｜DSML｜function_calls>"),
    "LFM2.5-Instruct": (None, "<|tool_call_start|>[get_weather(city='Paris, 東京')]<|tool_call_end|>"),
}


@pytest.mark.parametrize("template", NAMED_PARAM_CALLS)
def test_forced_call_with_named_parameters_takes_the_templates_own_call(smollm2, template):
    model, text = NAMED_PARAM_CALLS[template]
    if model is None:
        tok, g = smollm2
    else:
        path = os.path.join(SYNTH, model)
        if not os.path.exists(path):
            pytest.skip("synthetic models not here")
        tok = Tokenizer.from_gguf(path)
        g = Grammars(tok)
    with open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8") as f:
        fmt = co.detect(f.read())(TOOLS)
    weather = g.compile("lark", tool_call_lark(g, fmt, ["get_weather"], parallel=False))
    assert _accepts(tok, weather, text)
    assert [(c.name, json.loads(c.args)) for c in co.parse(text, fmt).calls] == [("get_weather", {"city": "Paris, 東京"})]
    # another tool, or the call with its required parameter left out, is not allowed
    only_add = g.compile("lark", tool_call_lark(g, fmt, ["add"], parallel=False))
    assert not _accepts(tok, only_add, text)
    no_city = text.replace("city", "town")
    assert not _accepts(tok, weather, no_city)


@pytest.mark.parametrize("template,call_text", [
    ("MiniMax-M2", '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris, 東京'
                   '</parameter>\n</invoke>\n</minimax:tool_call>'),
    ("Qwen3.5-4B", "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis, 東京\n</parameter>\n"
                   "</function>\n</tool_call>"),
])
def test_forced_call_comes_after_reasoning_the_prompt_opened(smollm2, template, call_text):
    """The prompt opens <think> (thinking on): as llama-server's grammar, the model reasons first,
    and the call after </think> is parsed as a call, not as reasoning."""
    tok, g = smollm2
    tmpl = ChatTemplate(open(os.path.join(TEMPLATES, template + ".jinja"), encoding="utf-8").read())
    req = S.ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "Weather?"}],
                                                  "tools": TOOLS, "tool_choice": "required"})
    opts = chat_options(req, ServerConfig(model="m"), tmpl)
    prompt = tmpl.render([{"role": "user", "content": "Weather?"}], tools=TOOLS, **opts.template_kwargs)
    opts.note_prompt(prompt)
    assert opts.open_reasoning_end == "</think>"
    grammar = compile_grammar(g, opts)
    text = "The user wants the weather.\n</think>\n\n" + call_text
    assert _accepts(tok, grammar, text)
    assert not _accepts(tok, grammar, call_text)       # reasoning first
    out = opts.output(prompt)()
    out.feed(text)
    out.finish()
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out.calls] == \
        [("get_weather", {"city": "Paris, 東京"})]
