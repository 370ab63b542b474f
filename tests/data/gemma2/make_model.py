"""A tiny random-weight gemma2 GGUF (Gemma 2: alternating sliding-window and
global attention layers, softcapped attention and output logits, pre and post norms,
GeGLU), written with the `gguf` package, deterministically.

Vocabulary: there is no Gemma SentencePiece vocabulary (256k) in llama.cpp's models/:
the phi-3 SentencePiece vocabulary of ../shared/golden/synth's synth-phi3 model, with
Gemma's `<start_of_turn>` / `<end_of_turn>` as control tokens on its unused ids 32011 /
32012 (llama.cpp ends a generation on `<end_of_turn>` by its text); bos `<s>` added,
eos `</s>`. Chat template: Gemma 2's,
tests/data/templates/google-gemma-2-2b-it.jinja (llama.cpp's models/templates,
unchanged). Shapes: n_embd 64, 4 layers, 4 q / 2 kv heads x 16, NeoX RoPE (base
10000), layers 0 and 2 sliding over a window of 32 (`attention.sliding_window`; the
pattern key left out: llama.cpp's default of 2), attention softcap 50, output
softcap 30, GeGLU FFN of 128, tied embeddings (Gemma 2's output is always them).
Weights as make_synth_text.py makes them: matrices ~ N(0, 1/fan_in) (q/k x4),
per-tensor seeds crc32("gemma2/" + name); a tiny embedding (heavy-tailed row norms;
the graph multiplies it by sqrt(64)) and a final-norm gain giving the logits a std of
~10 before the softcap, so that greedy steps are rarely near ties. Norms F32,
token_embd Q4_0, the other matrices Q8_0 (gguf.quants, as llama-quantize would
quantize them).

    python tests/data/gemma2/make_model.py OUT.gguf
"""
from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))   # tests/data: the shared writer
import synth_gguf

VOCAB_SOURCE = "/work/shared/golden/synth/models/synth-phi3-q4_k_m.gguf"
TEMPLATE = pathlib.Path(__file__).resolve().parents[1] / "templates" / "google-gemma-2-2b-it.jinja"
SPECIAL = {32011: "<start_of_turn>", 32012: "<end_of_turn>"}     # were [PAD32011], [PAD32012]
CONTROL = 3

ARCH = "gemma2"
N_EMBD, N_LAYER, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF = 64, 4, 4, 2, 16, 128
N_CTX_TRAIN, ROPE_BASE, RMS_EPS, N_SWA = 8192, 10000.0, 1e-6, 32
ATTN_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0
LOGIT_STD, EMBD_STD, ROW_TAIL, QK_SCALE = 10.0, 0.05, 0.2, 4.0


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
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(TEMPLATE.read_text(encoding="utf-8"))
    return len(tokens)


def _hparams(w: gguf.GGUFWriter, n_vocab: int) -> None:
    for key, value in (("context_length", N_CTX_TRAIN), ("embedding_length", N_EMBD), ("block_count", N_LAYER),
                       ("feed_forward_length", N_FF), ("attention.head_count", N_HEAD),
                       ("attention.head_count_kv", N_HEAD_KV), ("attention.key_length", HEAD_DIM),
                       ("attention.value_length", HEAD_DIM), ("attention.sliding_window", N_SWA),
                       ("vocab_size", n_vocab)):
        w.add_uint32(f"{ARCH}.{key}", value)
    for key, value in (("attention.layer_norm_rms_epsilon", RMS_EPS), ("rope.freq_base", ROPE_BASE),
                       ("attn_logit_softcapping", ATTN_SOFTCAP), ("final_logit_softcapping", FINAL_SOFTCAP)):
        w.add_float32(f"{ARCH}.{key}", value)


def _tensors(n_vocab: int) -> synth_gguf.Tensors:
    E, H, KV, D = N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM
    ts = synth_gguf.Tensors(ARCH)
    # tied embedding, small after the x sqrt(n_embd) input scale; the final-norm gain sets the logits' scale
    gain = ts.tied_embedding(n_vocab, E, EMBD_STD / np.sqrt(E), ROW_TAIL, LOGIT_STD)
    ts.norm("output_norm.weight", E, center=gain, spread=0.1 * gain)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        ts.norm(p + "attn_norm.weight", E)
        ts.mat(p + "attn_q.weight", [E, H * D], scale=QK_SCALE)
        ts.mat(p + "attn_k.weight", [E, KV * D], scale=QK_SCALE)
        ts.mat(p + "attn_v.weight", [E, KV * D])
        ts.mat(p + "attn_output.weight", [H * D, E])
        ts.norm(p + "post_attention_norm.weight", E)
        ts.norm(p + "ffn_norm.weight", E)
        ts.mat(p + "ffn_gate.weight", [E, N_FF])
        ts.mat(p + "ffn_up.weight", [E, N_FF])
        ts.mat(p + "ffn_down.weight", [N_FF, E])
        ts.norm(p + "post_ffw_norm.weight", E)
    return ts


def build(path: str) -> None:
    w = synth_gguf.writer(path, ARCH, "synth-gemma2")
    n_vocab = _copy_vocab(w)
    _hparams(w, n_vocab)
    synth_gguf.write(w, _tensors(n_vocab))


if __name__ == "__main__":
    build(sys.argv[1] if len(sys.argv) > 1 else "/tmp/synth-gemma2-q8_0.gguf")
