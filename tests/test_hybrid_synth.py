"""Issue 31's recurrent/hybrid architectures (qwen3next: gated delta net + gated
attention + MoE with a gated shared expert; lfm2: short-conv layers + attention;
granitehybrid: Mamba-2 + attention with Granite's scales; nemotron_h: Mamba-2,
attention and squared-ReLU MLP blocks)
against llama.cpp 11434 on their synthetic golden models (../shared/golden/synth:
random weights, real vocabularies and chat templates): every golden completion and
chat, the chats rendered and served as llama-server answered them, and the
recurrent state through batching, chunking and a 3-turn chat reusing its prefix."""
import httpx
import numpy as np
import pytest
from engine_helpers import GREEDY, generate, generate_requests, tokens
from server_harness import RunningServer
from synth_golden import LOGPROB_TOL, assert_same_as_llama_cpp, chat, completions, engine, model_path

from ggserve.models.registry import ModelError, model_class
from ggserve.models.weights import matmul_weight_names
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.engine import Request

ARCHS = ("qwen3next", "lfm2", "granitehybrid", "nemotron_h")
CASES = [pytest.param(a, c, id=f"{a}-{c['key']}") for a in ARCHS for c in completions()["models"][a]]
CHATS = [pytest.param(a, c, id=f"{a}-{c['key']}") for a in ARCHS for c in chat()["models"][a]]


def _case(arch: str, key: str) -> dict:
    return next(c for c in completions()["models"][arch] if c["key"] == key)


def _same_events(a, b) -> None:
    """Token for token and logprob for logprob the same (bit for bit)."""
    assert tokens(a) == tokens(b)
    assert [e.top_logprobs for e in a] == [e.top_logprobs for e in b]


@pytest.fixture(scope="module")
def engines():
    made = {}
    yield lambda arch: made.setdefault(arch, engine(arch, n_ctx=8192, n_parallel=4))   # 2048 per sequence
    for e in made.values():
        e.close()


_SOLO = {}


def _solo(engines, arch: str, prompt: list[int], n: int):
    """prompt run alone on an empty cache, n greedy tokens (cached per prompt)."""
    key = (arch, tuple(prompt), n)
    if key not in _SOLO:
        e = engines(arch)
        e.clear_cache()
        _SOLO[key] = generate(e, {"r": prompt}, n)["r"]
    return _SOLO[key]


@pytest.mark.parametrize("arch,case", CASES)
def test_completion_equals_llama_cpp(engines, arch, case):
    assert_same_as_llama_cpp(_solo(engines, arch, case["prompt_ids"], len(case["generated_ids"])), case)


@pytest.mark.parametrize("arch,conv", CHATS)
def test_chat_renders_tokenizes_and_answers_as_llama_server(engines, arch, conv):
    e = engines(arch)
    golden = conv["chat_completion"]
    req = golden["request"]
    text = e.chat_template.render(req["messages"], add_generation_prompt=True, tools=req.get("tools"))
    assert text == conv["prompt"]
    prompt = PromptBuilder.for_engine(e).chat(req["messages"], tools=req.get("tools"))
    assert prompt.tokens == conv["prompt_ids_add_special_parse_special"]
    assert golden["prompt_tokens"] == len(prompt.tokens)
    # as llama-server ran it: the prompt's chunks end at its checkpoints (the user
    # message's start among them), which llama.cpp's kernels see as separate ubatches
    e.clear_cache()
    r = Request("r", prompt.tokens, GREEDY, max_tokens=len(golden["generated_ids"]), ignore_eos=True,
                turn_starts=prompt.turn_starts)
    assert_same_as_llama_cpp(generate_requests(e, [r])["r"], golden)


@pytest.mark.parametrize("arch", ARCHS)
def test_four_prompts_batched_equal_each_alone(engines, arch):
    keys = ["capital", "story", "cjk", "long_prose"]          # short ones decode while the long one fills
    prompts = {k: _case(arch, k)["prompt_ids"] for k in keys}
    e = engines(arch)
    e.clear_cache()
    together = generate(e, prompts, 48)
    for k in keys:
        _same_events(together[k], _solo(engines, arch, prompts[k], 48))


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_longer_than_a_batch_equals_it_unbatched(engines, arch):
    case = _case(arch, "long_code")                            # 849 tokens: 14 chunks of 64
    chunked = engine(arch, n_batch=64)
    try:
        events = generate(chunked, {"r": case["prompt_ids"]}, 48)["r"]
    finally:
        chunked.close()
    whole = engine(arch, n_batch=1024)                         # one batch
    try:
        _same_events(events, generate(whole, {"r": case["prompt_ids"]}, 48)["r"])
    finally:
        whole.close()
    assert_same_as_llama_cpp(events, case)


def _chat_request(e, rid: str, messages: list[dict], n: int) -> Request:
    prompt = PromptBuilder.for_engine(e).chat(messages)
    return Request(rid, prompt.tokens, GREEDY, max_tokens=n, ignore_eos=True, turn_starts=prompt.turn_starts)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_three_turn_chat_reuses_its_prefix_and_answers_as_fresh(engines, arch):
    e = engines(arch)
    turns = [[{"role": "system", "content": "You are a terse assistant."},
              {"role": "user", "content": "What is 2 + 2?"}]]
    turns.append(turns[0] + [{"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 * 5?"}])
    turns.append(turns[1] + [{"role": "assistant", "content": "15."}, {"role": "user", "content": "And 7 - 1?"}])
    e.clear_cache()
    reqs = [_chat_request(e, f"t{i}", messages, 12) for i, messages in enumerate(turns)]
    answers = [generate_requests(e, [req])[req.id] for req in reqs]      # one after another, one slot
    assert answers[0][0].n_cached == 0
    for previous, answer in zip(reqs, answers[1:]):
        # the prompts part after the previous generation prompt: the state saved
        # 4 tokens before the previous prompt's end is restored
        assert answer[0].n_cached == len(previous.prompt) - 4
    for messages, answer in zip(turns, answers):   # each prompt alone, cut at the same checkpoints
        e.clear_cache()
        fresh = _chat_request(e, "fresh", messages, 12)
        _same_events(answer, generate_requests(e, [fresh])["fresh"])


@pytest.mark.parametrize("arch", ARCHS)
def test_served_chat_equals_llama_servers_message(arch):
    conv = next(c for c in chat()["models"][arch] if c["key"] == "system_user")
    golden = conv["chat_completion"]
    body = {"messages": golden["request"]["messages"], "max_tokens": len(golden["generated_ids"]),
            "temperature": 0, "logprobs": True, "top_logprobs": 5}
    cfg = ServerConfig(model=model_path(arch), n_ctx=4096, n_parallel=2, n_batch=512, n_threads=2)
    with RunningServer(create_app(cfg)) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert out["usage"]["prompt_tokens"] == golden["prompt_tokens"]
    assert choice["finish_reason"] == golden["finish_reason"]
    # the parsed message as llama-server parsed it (no tool calls; reasoning only where its
    # template opens a think block: nemotron_h's whole answer is reasoning)
    assert {k: choice["message"].get(k) for k in golden["message"]} == golden["message"]
    assert not choice["message"].get("tool_calls")
    assert bool(choice["message"].get("reasoning_content")) == bool(golden["message"].get("reasoning_content"))
    ours = choice["logprobs"]["content"]
    assert b"".join(bytes(t["bytes"]) for t in ours) == b"".join(bytes(s.get("bytes", b"")) for s in golden["steps"])
    pairs = [(t, s) for t, s in zip(ours, golden["steps"]) if s["probs_available"]]
    assert max(abs(t["logprob"] - s["logprob"]) for t, s in pairs) <= LOGPROB_TOL


# -- the models' structure ---------------------------------------------------------

def _build(arch: str, drop=(), meta_drop=()):
    path = model_path(arch)
    f = GGUFFile(path)
    meta = {k: v for k, v in f.metadata.items() if k not in meta_drop}
    return model_class(arch, path)(meta, {n: t for n, t in f.tensors.items() if n not in drop}, path)


def test_qwen3next_layers_experts_and_state_sizes():
    m = _build("qwen3next")
    assert m.is_recurrent == [True, True, True, False]
    assert (m.routing.n_expert, m.routing.n_used, m.n_ff_exp, m.n_ff_shexp) == (8, 2, 32, 32)
    specs = m.memory_layers(lambda il: None)
    # per sequence: 3 conv inputs of 256 channels (q|k|v), a 32x32 state per value head
    assert specs[0].sizes == (3 * 256, 32 * 32 * 4)
    assert type(specs[3]).__name__ == "LayerKV" and specs[3].n_embd_k == 32 * 2


@pytest.mark.parametrize("tensor", ["blk.0.ssm_ba.weight", "blk.3.attn_q_norm.weight",
                                    "blk.2.ffn_gate_inp_shexp.weight"])
def test_qwen3next_missing_tensor_names_file_and_tensor(tensor):
    with pytest.raises(ModelError, match=rf"synth-qwen3next-.*\.gguf: missing tensor '{tensor}'"):
        _build("qwen3next", drop={tensor})


def test_qwen3next_without_experts_is_a_clear_error():
    with pytest.raises(ModelError, match=r"qwen3next needs qwen3next.expert_count"):
        _build("qwen3next", meta_drop={"qwen3next.expert_count"})


def test_qwen3next_fused_beta_alpha_is_repacked_as_llama_cpp_repacks_it():
    names = matmul_weight_names(GGUFFile(model_path("qwen3next")).tensors)
    assert {"blk.0.ssm_ba.weight", "blk.0.attn_qkv.weight", "blk.0.ssm_out.weight"} <= names
    assert "blk.0.ssm_conv1d.weight" not in names


def test_lfm2_layer_kinds_follow_head_count_kv():
    m = _build("lfm2")
    assert m.is_recurrent == [True, False, True, False]       # head_count_kv [0, 1, 0, 1]
    specs = m.memory_layers(lambda il: None)
    assert specs[0].sizes == (2 * 32,)                        # the last l_cache - 1 = 2 inputs of 32 channels
    assert type(specs[1]).__name__ == "LayerKV" and specs[1].n_embd_k == 16
    assert m.output is m.tok_embd and m.output_norm is not None   # tied; final norm token_embd_norm


@pytest.mark.parametrize("tensor", ["blk.0.shortconv.conv.weight", "blk.2.shortconv.in_proj.weight",
                                    "blk.1.attn_k_norm.weight", "token_embd_norm.weight"])
def test_lfm2_missing_tensor_names_file_and_tensor(tensor):
    with pytest.raises(ModelError, match=rf"synth-lfm2-.*\.gguf: missing tensor '{tensor}'"):
        _build("lfm2", drop={tensor})


def test_lfm2_with_a_sliding_window_has_it_on_every_attention_layer():
    path = model_path("lfm2")
    f = GGUFFile(path)
    m = model_class("lfm2", path)({**f.metadata, "lfm2.attention.sliding_window": 64}, f.tensors, path)
    assert [getattr(s, "sliding_window", None) for s in m.memory_layers(lambda il: None)] == [None, 64, None, 64]
    assert [getattr(s, "sliding_window", None) for s in _build("lfm2").memory_layers(lambda il: None)] == \
        [None, 0, None, 0]


def test_lfm2_without_conv_length_is_a_clear_error():
    with pytest.raises(ModelError, match=r"missing metadata 'lfm2.shortconv.l_cache'"):
        _build("lfm2", meta_drop={"lfm2.shortconv.l_cache"})


def test_lfm2_short_conv_projections_are_repacked_as_llama_cpp_repacks_them():
    names = matmul_weight_names(GGUFFile(model_path("lfm2")).tensors)
    assert {"blk.0.shortconv.in_proj.weight", "blk.0.shortconv.out_proj.weight", "blk.1.attn_q.weight"} <= names
    assert "blk.0.shortconv.conv.weight" not in names and "token_embd_norm.weight" not in names


def test_granitehybrid_layer_kinds_scales_and_state_sizes():
    m = _build("granitehybrid")
    assert m.is_recurrent == [True, True, False, True]          # head_count_kv [0, 0, 2, 0]
    assert (m.embd_scale, m.kq_scale, m.logit_scale) == (12.0, 0.0078125, 8.0) and not m.use_rope
    specs = m.memory_layers(lambda il: None)
    # per sequence: the last 3 inputs of 192 conv channels (x | B | C), a 32 x 32 scan state per head of 4
    assert specs[0].sizes == (3 * 192, 32 * 128)
    assert type(specs[2]).__name__ == "LayerKV" and specs[2].n_embd_k == 2 * 16


@pytest.mark.parametrize("tensor", ["blk.0.ssm_in.weight", "blk.1.ssm_conv1d.bias", "blk.3.ssm_d"])
def test_granitehybrid_missing_tensor_names_file_and_tensor(tensor):
    with pytest.raises(ModelError, match=rf"synth-granitehybrid-.*\.gguf: missing tensor '{tensor}'"):
        _build("granitehybrid", drop={tensor})


def test_nemotron_h_block_kinds_follow_head_count_kv_and_ffn_length():
    m = _build("nemotron_h")
    assert m.kinds == ["mamba2", "mlp", "mamba2", "attention", "mamba2", "mlp"]
    specs = m.memory_layers(lambda il: None)
    # per sequence: the last 3 inputs of 128 conv channels (x | B | C of 2 groups), a 16 x 16 scan state per head of 4
    assert specs[0].sizes == (3 * 128, 16 * 64)
    assert specs[1] is None and type(specs[3]).__name__ == "LayerKV" and specs[3].n_embd_k == 2 * 32
    assert m.output is not m.tok_embd and m.eps == np.float32(1e-5)


@pytest.mark.parametrize("tensor", ["blk.0.ssm_norm.weight", "blk.1.ffn_up.weight", "blk.3.attn_k.weight",
                                    "blk.5.ffn_down.weight"])
def test_nemotron_h_missing_tensor_names_file_and_tensor(tensor):
    with pytest.raises(ModelError, match=rf"synth-nemotron_h-.*\.gguf: missing tensor '{tensor}'"):
        _build("nemotron_h", drop={tensor})
