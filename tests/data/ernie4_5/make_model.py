"""Two tiny random-weight ERNIE 4.5 GGUFs, written with the `gguf` package,
deterministically: `ernie4_5` (dense, as ERNIE-4.5-0.3B) and `ernie4_5-moe` (as
ERNIE-4.5-21B-A3B: a dense first layer, then softmax top-2 of 8 experts chosen with
the `exp_probs_b` selection bias, plus a shared expert).

Vocabulary: no ERNIE vocabulary (SentencePiece, 103k) in llama.cpp's models/: the
phi-3 SentencePiece vocabulary of ../shared/golden/synth's synth-phi3 model, with
ERNIE's `<|begin_of_sentence|>` / `<|end_of_sentence|>` (the chat template's cls and
sep tokens) as control tokens on its unused ids 32011 / 32012; bos `<s>`, eos `</s>`,
pad `<unk>`, no BOS added (ERNIE's tokenizer_config: add_bos_token false; the template
writes the cls token itself). Chat template: ERNIE-4.5-0.3B-PT's (ernie-4.5.jinja).
Shapes: n_embd 64, 4 layers, 4 q / 2 kv heads x 16, NORM RoPE (base 500000, as
ERNIE 4.5) over all 16 dims, dense FFN 128; MoE: experts of 64, shared expert 64.
Weights as make_synth_text.py makes them: matrices ~ N(0, 1/fan_in) (q/k x4, router
x3), per-tensor seeds crc32(arch + "/" + name); a tiny tied embedding (heavy-tailed
row norms) and a final-norm gain giving the logits a std of ~10, so that greedy steps
are rarely near ties. Norms, router and selection bias F32, token_embd Q4_0, the
other matrices Q8_0 (gguf.quants, as llama-quantize would quantize them).

    python tests/data/ernie4_5/make_model.py OUT.gguf [--moe]
"""
from __future__ import annotations

import pathlib
import sys

import gguf
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-phi3-q4_k_m.gguf"
TEMPLATE = pathlib.Path(__file__).resolve().parent / "ernie-4.5.jinja"
SPECIAL = {32011: "<|begin_of_sentence|>", 32012: "<|end_of_sentence|>"}     # were [PAD32011], [PAD32012]
CONTROL = 3

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 4, 2, 16, 128
N_EXPERT, N_EXPERT_USED, N_FF_EXP, N_FF_SHEXP, N_DENSE_LEAD = 8, 2, 64, 64, 1
N_CTX_TRAIN, ROPE_BASE, RMS_EPS = 131072, 500000.0, 1e-5
LOGIT_STD, EMBD_STD, ROW_TAIL, ROUTER_SCALE, QK_SCALE, PROBS_B_STD = 10.0, 0.05, 0.2, 3.0, 4.0, 0.05


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    from ggserve.native.gguf_file import GGUFFile  # fast reader (gguf.GGUFReader is slow on a vocab)
    m = GGUFFile(VOCAB_SOURCE).metadata
    tokens, types = list(m["tokenizer.ggml.tokens"]), [int(t) for t in m["tokenizer.ggml.token_type"]]
    for i, tok in SPECIAL.items():
        assert tokens[i] == f"[PAD{i}]", tokens[i]
        tokens[i], types[i] = tok, CONTROL
    w.add_tokenizer_model(m["tokenizer.ggml.model"])
    w.add_tokenizer_pre(m["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    w.add_token_scores([float(s) for s in m["tokenizer.ggml.scores"]])
    w.add_token_types(types)
    w.add_bos_token_id(tokens.index("<s>"))
    w.add_eos_token_id(tokens.index("</s>"))
    w.add_unk_token_id(tokens.index("<unk>"))
    w.add_pad_token_id(tokens.index("<unk>"))
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return len(tokens)


def _hparams(w: gguf.GGUFWriter, arch: str, n_vocab: int, moe: bool) -> None:
    u32 = [("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
           ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD), ("attention.head_count_kv", N_HEAD_KV),
           ("rope.dimension_count", HEAD_DIM), ("vocab_size", n_vocab)]
    if moe:
        u32 += [("expert_count", N_EXPERT), ("expert_used_count", N_EXPERT_USED),
                ("expert_feed_forward_length", N_FF_EXP), ("expert_shared_feed_forward_length", N_FF_SHEXP),
                ("interleave_moe_layer_step", 1), ("leading_dense_block_count", N_DENSE_LEAD)]
    for key, value in u32:
        w.add_uint32(f"{arch}.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", RMS_EPS), ("rope.freq_base", ROPE_BASE)):
        w.add_float32(f"{arch}.{key}", value)


def _tensors(arch: str, n_vocab: int, moe: bool) -> synth_gguf.Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = synth_gguf.Tensors(arch)
    # tied embedding, small; the final-norm gain sets the logits' scale
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD, ROW_TAIL, LOGIT_STD)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.mat(p + "attn_output.weight", [H * D, E])
        ts.norm(p + "ffn_norm.weight", E)
        if not moe or i < N_DENSE_LEAD:
            ts.mat(p + "ffn_gate.weight", [E, N_FF])
            ts.mat(p + "ffn_up.weight", [E, N_FF])
            ts.mat(p + "ffn_down.weight", [N_FF, E])
            continue
        ts.mat(p + "ffn_gate_inp.weight", [E, N_EXPERT], scale=ROUTER_SCALE, qtype=Q.F32)
        ts.add(p + "exp_probs_b.bias", PROBS_B_STD * ts.rng(p + "exp_probs_b.bias").standard_normal(N_EXPERT))
        ts.mat(p + "ffn_gate_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_up_exps.weight", [E, N_FF_EXP, N_EXPERT], fan_in=E)
        ts.mat(p + "ffn_down_exps.weight", [N_FF_EXP, E, N_EXPERT], fan_in=N_FF_EXP)
        ts.mat(p + "ffn_gate_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_up_shexp.weight", [E, N_FF_SHEXP])
        ts.mat(p + "ffn_down_shexp.weight", [N_FF_SHEXP, E])
    return ts


def build(path: str, moe: bool = False) -> None:
    arch = "ernie4_5-moe" if moe else "ernie4_5"
    w = synth_gguf.writer(path, arch, f"synth-{arch}")
    n_vocab = _copy_vocab(w)
    _hparams(w, arch, n_vocab, moe)
    synth_gguf.write(w, _tensors(arch, n_vocab, moe))


if __name__ == "__main__":
    moe = "--moe" in sys.argv[2:]
    build(sys.argv[1] if len(sys.argv) > 1 else f"/tmp/synth-ernie4_5{'-moe' if moe else ''}-q8_0.gguf", moe=moe)
