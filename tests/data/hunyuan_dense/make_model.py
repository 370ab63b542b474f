"""A tiny random-weight hunyuan-dense GGUF (Tencent Hunyuan dense: NeoX RoPE with
Hunyuan's NTK alpha, q/k RMS norms after RoPE, SwiGLU), written with the `gguf`
package, deterministically.

Vocabulary: no Hunyuan vocabulary in llama.cpp's models/: the gpt-2 one of
../shared/golden/synth's synth-mistral3 model. No chat template (llama-server then
formats chats as ChatML). Shapes: n_embd 64, 4 layers, 4 q / 2 kv heads x 16, NeoX
RoPE over all 16 dims, base 10000 with `rope.scaling.alpha` 2 (base x 2^(16/14)),
SwiGLU FFN of 128, RMS eps 1e-5, tied embeddings. Weights as make_synth_text.py makes
them: matrices ~ N(0, 1/fan_in), q/k norm gains ~ 3 (peaked attention), per-tensor
seeds crc32("hunyuan-dense/" + name); a tiny tied embedding (heavy-tailed row norms) and
a final-norm gain giving the logits a std of ~10, so that greedy steps are rarely near
ties. Norms F32, token_embd Q4_0, the other matrices Q8_0 (gguf.quants, as
llama-quantize would quantize them).

    python tests/data/hunyuan_dense/make_model.py OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import gguf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

ARCH = "hunyuan-dense"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-mistral3-q8_0.gguf"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 4, 2, 16, 128
N_CTX_TRAIN, ROPE_BASE, ROPE_ALPHA, RMS_EPS = 32768, 10000.0, 2.0, 1e-5
LOGIT_STD, EMBD_STD, ROW_TAIL, QK_NORM_GAIN = 10.0, 0.05, 0.2, 3.0


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    return synth_gguf.copy_bpe_vocab(w, VOCAB_SOURCE, unk=False)


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", HEAD_DIM),
                       ("vocab_size", n_vocab)):
        w.add_uint32(f"{ARCH}.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", RMS_EPS), ("rope.freq_base", ROPE_BASE),
                       ("rope.scaling.alpha", ROPE_ALPHA)):
        w.add_float32(f"{ARCH}.{key}", value)


def _tensors(n_vocab: int) -> synth_gguf.Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = synth_gguf.Tensors(ARCH)
    # tied embedding, small; the final-norm gain sets the logits' scale
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD, ROW_TAIL, LOGIT_STD)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D])
        ts.mat(p + "attn_k.weight", [E, KV * D])
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.norm(p + "attn_q_norm.weight", D, center=QK_NORM_GAIN, spread=0.3)
        ts.norm(p + "attn_k_norm.weight", D, center=QK_NORM_GAIN, spread=0.3)
        ts.mat(p + "attn_output.weight", [H * D, E])
        ts.norm(p + "ffn_norm.weight", E)
        ts.mat(p + "ffn_gate.weight", [E, N_FF])
        ts.mat(p + "ffn_up.weight", [E, N_FF])
        ts.mat(p + "ffn_down.weight", [N_FF, E])
    return ts


def build(path: str) -> None:
    w = synth_gguf.writer(path, ARCH, "synth-hunyuan-dense")
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    synth_gguf.write(w, _tensors(n_vocab))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-hunyuan-dense-q8_0.gguf")
