"""Qwen3.5 (gated-delta-net layers with a recurrent state per sequence + gated
full-attention layers with M-RoPE) against llama.cpp 11434 on the synthetic model
of ../shared/golden/synth (real Qwen vocabulary and chat template, random
weights), and its recurrent state through batching, chunking and prefix reuse."""
import httpx
import pytest

from ggserve.models.registry import ModelError, model_class
from ggserve.models.weights import matmul_weight_names
from ggserve.native.gguf_file import GGUFFile, TensorInfo
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.chat.prompts import PromptBuilder
from engine_helpers import GREEDY, generate, generate_requests, tokens
from server_harness import RunningServer
from synth_golden import LOGPROB_TOL, assert_same_as_llama_cpp, chat, completions, model_path

ARCH = "qwen35"
CASES = {c["key"]: c for c in completions()["models"][ARCH]}
CHATS = {c["key"]: c for c in chat()["models"][ARCH]}


@pytest.fixture(scope="module")
def engine():
    e = Engine(EngineConfig(model_path(ARCH), n_ctx=4096, n_batch=512, n_parallel=4, n_threads=2))
    yield e
    e.close()


_SOLO = {}


def solo(engine, prompt: list[int], n: int):
    """prompt run alone on an empty cache, n greedy tokens (cached per prompt)."""
    key = (tuple(prompt), n)
    if key not in _SOLO:
        engine.clear_cache()
        _SOLO[key] = generate(engine, {"r": prompt}, n)["r"]
    return _SOLO[key]


def _same_events(a, b) -> None:
    """Token for token and logprob for logprob the same (bit for bit)."""
    assert tokens(a) == tokens(b)
    assert [e.top_logprobs for e in a] == [e.top_logprobs for e in b]


@pytest.mark.parametrize("key", list(CASES))
def test_completion_equals_llama_cpp(engine, key):
    case = CASES[key]
    assert_same_as_llama_cpp(solo(engine, case["prompt_ids"], len(case["generated_ids"])), case)


@pytest.mark.parametrize("key", list(CHATS))
def test_chat_prompt_renders_and_tokenizes_as_llama_cpp(engine, key):
    conv = CHATS[key]
    req = conv["chat_completion"]["request"]
    text = engine.chat_template.render(req["messages"], add_generation_prompt=True, tools=req.get("tools"))
    assert text == conv["prompt"]
    assert text.endswith("<|im_start|>assistant\n<think>\n")     # the template opens the reasoning
    assert engine.tokenizer.encode(text, add_special=True, parse_special=True) == \
        conv["prompt_ids_add_special_parse_special"]


@pytest.mark.parametrize("key", list(CHATS))
def test_chat_completion_equals_llama_server(engine, key):
    conv = CHATS[key]
    golden = conv["chat_completion"]
    prompt = conv["prompt_ids_add_special_parse_special"]
    assert golden["prompt_tokens"] == len(prompt)
    assert_same_as_llama_cpp(solo(engine, prompt, len(golden["generated_ids"])), golden)


def test_four_prompts_batched_equal_each_alone(engine):
    keys = ["capital", "story", "cjk", "long_prose"]          # 5, 13, 3 and 610 tokens
    engine.clear_cache()
    together = generate(engine, {k: CASES[k]["prompt_ids"] for k in keys}, 48)
    for k in keys:
        _same_events(together[k], solo(engine, CASES[k]["prompt_ids"], 48))


def test_prompt_fed_in_chunks_equals_it_fed_whole():
    prompt = CASES["long_prose"]["prompt_ids"]                # 610 tokens in chunks of 64 (the last 34)
    chunked = Engine(EngineConfig(model_path(ARCH), n_ctx=4096, n_batch=64, n_parallel=1, n_threads=2))
    try:
        events = generate(chunked, {"r": prompt}, 48)["r"]
    finally:
        chunked.close()
    assert_same_as_llama_cpp(events, CASES["long_prose"])


def test_a_prefix_ending_where_the_state_ends_is_reused_and_equals_a_fresh_prompt(engine):
    first = CASES["story"]["prompt_ids"]
    engine.clear_cache()
    answer = tokens(generate(engine, {"a": first}, 8)["a"])
    # the state holds the prompt and the first 7 answer tokens (the 8th was sampled, not computed)
    follow_up = first + answer[:7] + CASES["code_fib"]["prompt_ids"]
    reused = generate(engine, {"b": follow_up}, 16)["b"]
    assert reused[0].n_cached == len(first) + 7
    _same_events(reused, solo(engine, follow_up, 16))


def test_a_prefix_ending_before_the_state_ends_restores_the_state_saved_before_the_prompts_tail(engine):
    first = CASES["qa_math"]["prompt_ids"]                    # 13 tokens: state saved after 9
    engine.clear_cache()
    generate(engine, {"a": first}, 4)
    other = first[:-3] + CASES["cjk"]["prompt_ids"]          # shares 10 tokens
    again = generate(engine, {"b": other}, 16)["b"]
    assert again[0].n_cached == 9
    _same_events(again, solo(engine, other, 16))


def test_a_prefix_shorter_than_any_saved_state_is_recomputed(engine):
    first = CASES["qa_math"]["prompt_ids"]
    engine.clear_cache()
    generate(engine, {"a": first}, 4)
    other = first[:5] + CASES["cjk"]["prompt_ids"]
    again = generate(engine, {"b": other}, 16)["b"]
    assert again[0].n_cached == 0
    _same_events(again, solo(engine, other, 16))


def _chat_request(engine, rid: str, messages: list[dict], n: int) -> Request:
    prompt = PromptBuilder.for_engine(engine).chat(messages)
    return Request(rid, prompt.tokens, GREEDY, max_tokens=n, ignore_eos=True, turn_starts=prompt.turn_starts)


def test_the_next_turn_of_a_chat_reuses_the_conversation(engine):
    turn1 = [{"role": "system", "content": "You are a terse assistant."},
             {"role": "user", "content": "What is 2 + 2?"}]
    turn2 = turn1 + [{"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 * 5?"}]
    engine.clear_cache()
    first = _chat_request(engine, "t1", turn1, 8)
    generate_requests(engine, [first])
    # the template drops the first answer's reasoning: the prompts part after "<|im_start|>assistant\n";
    # the state saved 4 tokens before the first prompt's end (before "assistant\n<think>\n") is restored
    second = _chat_request(engine, "t2", turn2, 16)
    reused = generate_requests(engine, [second])["t2"]
    assert reused[0].n_cached == len(first.prompt) - 4
    engine.clear_cache()
    fresh = generate_requests(engine, [_chat_request(engine, "t3", turn2, 16)])["t3"]
    assert fresh[0].n_cached == 0
    _same_events(reused, fresh)


def test_another_conversation_with_the_same_system_prompt_reuses_it(engine):
    system = {"role": "system", "content": "You are a terse assistant. " * 20}
    other = [system, {"role": "user", "content": "Name a number."}]
    a = _chat_request(engine, "a", [system, {"role": "user", "content": "Name a colour."}], 4)
    engine.clear_cache()
    generate_requests(engine, [a])
    reused = generate_requests(engine, [_chat_request(engine, "b", other, 16)])["b"]
    assert reused[0].n_cached == a.turn_starts[0] > 100          # the state saved where the user turn starts
    engine.clear_cache()
    _same_events(reused, generate_requests(engine, [_chat_request(engine, "c", other, 16)])["c"])


def test_prompts_with_a_common_prefix_each_compute_it(engine):
    # a recurrent state cannot be cut at the common prefix: nothing waits for it
    prefix = CASES["long_prose"]["prompt_ids"][:200]
    prompts = {k: prefix + CASES[k]["prompt_ids"] for k in ("capital", "story")}
    engine.clear_cache()
    together = generate(engine, prompts, 8)
    for k, p in prompts.items():
        assert together[k][0].n_cached == 0
        _same_events(together[k], solo(engine, p, 8))


def test_served_chat_completion_equals_llama_server():
    conv = CHATS["system_user"]
    golden = conv["chat_completion"]
    req = golden["request"]
    body = {"messages": req["messages"], "max_tokens": req["max_tokens"], "temperature": 0,
            "logprobs": True, "top_logprobs": 5}
    cfg = ServerConfig(model=model_path(ARCH), n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert out["usage"]["prompt_tokens"] == golden["prompt_tokens"]
    # the template opened <think>: all of the (random) answer is reasoning, as llama-server parsed it
    assert {k: choice["message"].get(k) for k in golden["message"]} == golden["message"]
    assert choice["finish_reason"] == "length"
    ours = choice["logprobs"]["content"]
    assert [bytes(e["bytes"]) for e in ours] == [bytes(s["bytes"]) for s in golden["steps"]]
    for mine, step in zip(ours, golden["steps"]):
        top = {bytes(t["bytes"]): t["logprob"] for t in mine["top_logprobs"]}
        for t in step["top_logprobs"]:
            assert abs(top[bytes(t["bytes"])] - t["logprob"]) <= LOGPROB_TOL



def _build(drop=(), reshape=None, meta_drop=()):
    """The model built from the synthetic file's metadata and tensor table, changed."""
    path = model_path(ARCH)
    f = GGUFFile(path)
    meta = {k: v for k, v in f.metadata.items() if k not in meta_drop}
    tensors = {name: t for name, t in f.tensors.items() if name not in drop}
    if reshape:
        name, ne = reshape
        t = tensors[name]
        tensors[name] = TensorInfo(name, t.ggml_type, ne, t.offset, t.nbytes)
    return model_class(ARCH, path)(meta, tensors, path)


def test_layers_follow_the_full_attention_interval():
    model = _build()
    assert model.is_recurrent == [True, True, True, False]     # every 4th layer attends
    assert [type(m).__name__ for m in model.memory_layers(lambda il: None)] == \
        ["LayerRecurrent", "LayerRecurrent", "LayerRecurrent", "LayerKV"]
    # per sequence: 3 conv inputs of 256 channels (q|k|v), a 32x32 state per value head
    assert model.memory_layers(lambda il: None)[0].sizes == (3 * 256, 32 * 32 * 4)


@pytest.mark.parametrize("tensor", ["blk.1.ssm_a", "blk.0.ssm_conv1d.weight", "blk.3.attn_q_norm.weight"])
def test_a_missing_tensor_names_file_and_tensor(tensor):
    with pytest.raises(ModelError, match=rf"synth-qwen35-.*\.gguf: missing tensor '{tensor}'"):
        _build(drop={tensor})


def test_a_misshapen_tensor_names_file_and_tensor():
    # the attention layer's query projection holds query and gate: [n_embd, 2 * 4 heads * 64]
    with pytest.raises(ModelError, match=r"synth-qwen35-.*\.gguf: tensor 'blk.3.attn_q.weight' has shape "
                                         r"\(32, 256\), expected \(32, 512\)"):
        _build(reshape=("blk.3.attn_q.weight", (32, 256, 1, 1)))


def test_missing_delta_net_metadata_names_file_and_key():
    with pytest.raises(ModelError, match=r"synth-qwen35-.*\.gguf: missing metadata 'qwen35.ssm.state_size'"):
        _build(meta_drop={"qwen35.ssm.state_size"})


def test_the_delta_nets_matrices_may_be_repacked_as_llama_cpp_repacks_them():
    # every weight llama.cpp multiplies with mul_mat (its CPU backend may repack those), not the conv kernel
    names = matmul_weight_names(GGUFFile(model_path(ARCH)).tensors)
    assert {f"blk.0.{n}.weight" for n in ("attn_qkv", "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out")} <= names
    assert "blk.0.ssm_conv1d.weight" not in names and "blk.0.ssm_a" not in names
