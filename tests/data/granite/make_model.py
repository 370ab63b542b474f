"""A tiny random-weight granite GGUF (IBM Granite 3.x dense: RoPE attention with
rope_freqs frequency factors, SwiGLU FFN, Granite's scales), written with the `gguf`
package, deterministically.

Vocabulary: that of the synthetic granitehybrid model of ../shared/golden/synth
(the real Granite-3 vocabulary: starcoder with `<|end_of_text|>` and the three role
tokens, as make_synth_text.py's `granite_roles` patch writes it). Chat template:
Granite 3.3's, tests/data/templates/ibm-granite-granite-3.3-2B-Instruct.jinja
(llama.cpp's models/templates, unchanged). Shapes: n_embd 64, 4 layers, 4 q / 2 kv
heads x 16 with NORM RoPE over all 16 dims (`rope.scaling.finetuned` left out: on,
as llama.cpp defaults it for Granite) divided by the 8 factors of `rope_freqs.weight`,
SwiGLU FFN of 128. Granite's scales as in the synthetic granitehybrid: input x12,
attention scale 1/128, sub-layer outputs x0.22 before each residual add, logits /8.
Weights as make_synth_text.py makes them: matrices ~ N(0, 1/fan_in) (q/k x4,
attention output and FFN down x3 to outweigh the residual scale), per-tensor seeds
crc32("granite/" + name); a tiny tied embedding (heavy-tailed row norms) and a
final-norm gain giving the logits a std of ~10, so that greedy steps are rarely near
ties. Norms and rope_freqs F32, token_embd Q4_0, the other matrices Q8_0
(gguf.quants, as llama-quantize would quantize them).

    python tests/data/granite/make_model.py OUT.gguf [--no-rope]
"""
from __future__ import annotations

import pathlib
import sys
import zlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

ARCH = "granite"
VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-granitehybrid-q8_0.gguf"
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "templates" / "ibm-granite-granite-3.3-2B-Instruct.jinja"

N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM = 64, 4, 4, 2, 16
N_FF = 128
ROPE_FREQS = [1.0, 1.0, 1.0, 1.5, 2.0, 3.0, 5.0, 8.0]    # per rotated pair: frequency divided by it
N_CTX_TRAIN, ROPE_BASE, RMS_EPS = 131072, 10000.0, 1e-5
EMBEDDING_SCALE, ATTENTION_SCALE, RESIDUAL_SCALE, LOGIT_SCALE = 12.0, 0.0078125, 0.22, 8.0
LOGIT_STD, EMBD_STD, ROW_TAIL, QK_SCALE, OUT_SCALE = 10.0, 0.05, 0.2, 4.0, 3.0


def _rng(name: str):
    return np.random.default_rng(zlib.crc32(f"{ARCH}/{name}".encode()))


class Tensors:
    def __init__(self):
        self.items = []      # (name, f32 array in numpy order = reversed ggml ne, ggml type)

    def add(self, name, arr, qtype=Q.F32):
        self.items.append((name, np.ascontiguousarray(arr, dtype=np.float32), qtype))

    def mat(self, name, ne, fan_in=None, scale=1.0, qtype=Q.Q8_0):
        fan_in = fan_in or ne[0]
        a = _rng(name).standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(scale / np.sqrt(fan_in))
        self.add(name, a, qtype)

    def norm(self, name, n, center=1.0, spread=0.1):
        self.add(name, center + spread * _rng(name).standard_normal(n, dtype=np.float32))


def _copy_vocab(w: gguf.GGUFWriter) -> int:
    from ggserve.native.gguf_file import GGUFFile  # fast reader (gguf.GGUFReader is slow on a vocab)
    m = GGUFFile(VOCAB_SOURCE).metadata
    w.add_tokenizer_model(m["tokenizer.ggml.model"])
    w.add_tokenizer_pre(m["tokenizer.ggml.pre"])
    w.add_token_list(m["tokenizer.ggml.tokens"])
    w.add_token_types([int(t) for t in m["tokenizer.ggml.token_type"]])
    w.add_token_merges(m["tokenizer.ggml.merges"])
    w.add_bos_token_id(m["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(m["tokenizer.ggml.eos_token_id"])
    w.add_unk_token_id(m["tokenizer.ggml.unknown_token_id"])
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return len(m["tokenizer.ggml.tokens"])


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    A = ARCH
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("rope.dimension_count", HEAD_DIM),
                       ("vocab_size", n_vocab)):
        w.add_uint32(f"{A}.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", RMS_EPS), ("rope.freq_base", ROPE_BASE),
                       ("attention.scale", ATTENTION_SCALE), ("embedding_scale", EMBEDDING_SCALE),
                       ("residual_scale", RESIDUAL_SCALE), ("logit_scale", LOGIT_SCALE)):
        w.add_float32(f"{A}.{key}", value)


def _tensors(n_vocab: int) -> Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = Tensors()
    # tied embedding, small after the x12 input scale; the final-norm gain sets the logits' scale (x logit_scale,
    # which the graph divides out)
    r = _rng("token_embd.weight")
    emb = r.standard_normal((n_vocab, E), dtype=np.float32)
    emb *= np.exp(ROW_TAIL * r.standard_normal((n_vocab, 1))).astype(np.float32) * np.float32(EMBD_STD / EMBEDDING_SCALE)
    ts.add("token_embd.weight", emb, Q.Q4_0)
    gain = LOGIT_STD * LOGIT_SCALE / (float(np.sqrt(np.mean(np.square(emb), dtype=np.float64))) * np.sqrt(E))
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    ts.add("rope_freqs.weight", np.array(ROPE_FREQS))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.mat(p + "attn_output.weight", [H * D, E], scale=OUT_SCALE)
        ts.norm(p + "ffn_norm.weight", E)
        ts.mat(p + "ffn_gate.weight", [E, N_FF])
        ts.mat(p + "ffn_up.weight", [E, N_FF])
        ts.mat(p + "ffn_down.weight", [N_FF, E], scale=OUT_SCALE)
    return ts


def build(path: str, rope: bool = True) -> None:
    """rope False: the same weights with `rope.scaling.finetuned` false (Granite's switch: no RoPE)."""
    w = gguf.GGUFWriter(path, ARCH)
    w.add_name("synth-granite")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    if not rope:
        w.add_bool(f"{ARCH}.rope.scaling.finetuned", False)
    for name, arr, qtype in _tensors(n_vocab).items:
        if qtype == Q.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-granite-q8_0.gguf", rope="--no-rope" not in sys.argv[2:])
