"""A tiny random-weight starcoder2 GGUF (StarCoder 2: LayerNorm with biases, NeoX
RoPE, q/k/v and output biases, a plain GELU MLP with biases), written with the `gguf`
package, deterministically.

Vocabulary: that of the synthetic granitehybrid model of ../shared/golden/synth (the
StarCoder vocabulary StarCoder 2 uses, with Granite's `<|end_of_text|>` and three role
tokens as make_synth_text.py's `granite_roles` patch writes them). No chat template
(StarCoder 2 base models have none): llama-server then formats chats as ChatML.
Shapes: n_embd 64, 4 layers, 4 q / 2 kv heads x 16, NeoX RoPE (base 100000) over all
16 dims, MLP of 256, LayerNorm eps 1e-5, tied embeddings. Weights as
make_synth_text.py makes them: matrices ~ N(0, 1/fan_in) (q/k x4), biases ~ N(0,
0.1^2), norms ~ 1 with biases ~ N(0, 0.05^2), per-tensor seeds crc32("starcoder2/" +
name); a tiny tied embedding (heavy-tailed row norms) and a final-norm gain giving the
logits a std of ~10, so that greedy steps are rarely near ties. Norms and biases F32,
token_embd Q4_0, the other matrices Q8_0 (gguf.quants, as llama-quantize would
quantize them).

    python tests/data/starcoder2/make_model.py OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import gguf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

ARCH = "starcoder2"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-granitehybrid-q8_0.gguf"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 4, 2, 16, 256
N_CTX_TRAIN, ROPE_BASE, NORM_EPS = 16384, 100000.0, 1e-5
LOGIT_STD, EMBD_STD, ROW_TAIL, QK_SCALE, BIAS_STD, NORM_BIAS_STD = 10.0, 0.05, 0.2, 4.0, 0.1, 0.05


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    return synth_gguf.copy_bpe_vocab(w, VOCAB_SOURCE)


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", HEAD_DIM),
                       ("vocab_size", n_vocab)):
        w.add_uint32(f"{ARCH}.{key}", value)
    for key, value in (("attention.layer_norm_epsilon", NORM_EPS), ("rope.freq_base", ROPE_BASE)):
        w.add_float32(f"{ARCH}.{key}", value)


def _tensors(n_vocab: int) -> synth_gguf.Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = synth_gguf.Tensors(ARCH, bias_std=BIAS_STD)
    # tied embedding, small; the final-norm gain sets the logits' scale
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD, ROW_TAIL, LOGIT_STD)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    ts.bias("output_norm.bias", E, std=NORM_BIAS_STD * gain)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.bias(p + "attn_norm.bias", E, std=NORM_BIAS_STD)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.bias(p + "attn_q.bias", H * D)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.bias(p + "attn_k.bias", KV * D)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.bias(p + "attn_v.bias", KV * D)
        ts.mat(p + "attn_output.weight", [H * D, E])
        ts.bias(p + "attn_output.bias", E)
        ts.norm(p + "ffn_norm.weight", E)
        ts.bias(p + "ffn_norm.bias", E, std=NORM_BIAS_STD)
        ts.mat(p + "ffn_up.weight", [E, N_FF])
        ts.bias(p + "ffn_up.bias", N_FF)
        ts.mat(p + "ffn_down.weight", [N_FF, E])
        ts.bias(p + "ffn_down.bias", E)
    return ts


def build(path: str) -> None:
    w = synth_gguf.writer(path, ARCH, "synth-starcoder2")
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    synth_gguf.write(w, _tensors(n_vocab))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-starcoder2-q8_0.gguf")
