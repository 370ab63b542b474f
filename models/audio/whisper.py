"""Whisper-encoder families: Ultravox, Voxtral, Qwen2-Audio (qwen2a / qwen2.5o), Music Flamingo, GLM-ASR (glma).

ref: llama.cpp tools/mtmd/models/whisper-enc.cpp, clip.cpp (build_vit, build_stack,
clip_n_output_tokens), mtmd.cpp (init_audio: the wrapper text).

One 3000-frame log-mel chunk [n_mel, 3000] ->
  conv1d k3 s1 (+b, GELU-erf) -> conv1d k3 s2 (+b, GELU-erf)   [e, 1500]
  + learned positions -> pre-LN transformer blocks (GELU-erf FFN)
  (voxtral, qwen2a: average pool 2) -> post LN
  (ultravox, voxtral: stack `stack_factor` frames per row, zero padded)
  -> the projector:
     ultravox  RMS norm * norm_pre -> mlp.1 -> SwiGLU (silu of the second half) -> RMS norm * norm_mid -> mlp.2
     voxtral   mlp.1 -> GELU-erf -> mlp.2
     qwen2a    fc (+b)
     musicflamingo  mlp.1 (+b) -> GELU-erf -> mlp.2 (+b)
     glma      LayerNorm (norm_pre) -> stack -> mlp.1 (+b) -> GELU-erf -> mlp.2 (+b), between the learned
               rows v.boi and v.eoi

Tokens per chunk are the graph's rows: llama.cpp 11434 counts ultravox/voxtral rows
from the mel frames aligned to the stack factor (3000/8/2 = 187 for Ultravox's real
factor 8) while its graph stacks the 1500 (Voxtral: 750) encoder rows, padding to 188,
and aborts; the HF models pad the frames to a multiple of the factor as the graph does,
so we count the graph's rows.
"""
from __future__ import annotations

import math

from ggserve.models.audio.mel import whisper_chunk_frames, whisper_chunks
from ggserve.models.vision import vit
from ggserve.native import ggml

FAMILIES = ("ultravox", "voxtral", "qwen2a", "musicflamingo", "glma")
AVG_POOL = ("voxtral", "qwen2a", "musicflamingo")
STACKED = ("ultravox", "voxtral")
WRAPPERS = {"qwen2a": ("<|audio_bos|>", "<|audio_eos|>"), "voxtral": ("[BEGIN_AUDIO]", ""), "ultravox": ("", ""),
            "musicflamingo": ("<sound>", ""), "glma": ("", "")}
N_FRAMES = 3000


class WhisperEncoder:
    def __init__(self, cfg, w):
        self.cfg = cfg
        e, m = cfg.n_embd, cfg.n_mel
        self.conv1 = w.get("a.conv1d.1.weight", (3, m, e))
        self.conv1_b = w.get("a.conv1d.1.bias", (1, e))
        self.conv2 = w.get("a.conv1d.2.weight", (3, e, e))
        self.conv2_b = w.get("a.conv1d.2.bias", (1, e))
        self.pos = w.get("a.position_embd.weight", (e,))
        if self.pos.ne[1] < self.n_pos:
            raise ValueError(f"a.position_embd has {self.pos.ne[1]} rows, the encoder needs {self.n_pos}")
        self.blocks = [vit.Block(w, i, e, cfg.n_ff, tower="a") for i in range(cfg.n_layer)]
        self.post_ln = (w.get("a.post_ln.weight", (e,), required=False), w.get("a.post_ln.bias", (e,), required=False))
        p = cfg.projector
        e_in = e * (cfg.stack_factor if p in STACKED else 1)
        if p == "ultravox":
            self.norm_pre = w.get("mm.a.norm_pre.weight", (e_in,))
            self.mlp1 = w.get("mm.a.mlp.1.weight", (e_in,))
            self.norm_mid = w.get("mm.a.norm_mid.weight", (self.mlp1.ne[1] // 2,))
            self.mlp2 = w.get("mm.a.mlp.2.weight", (self.mlp1.ne[1] // 2,))
            self.n_embd_out = self.mlp2.ne[1]
        elif p in ("voxtral", "musicflamingo", "glma"):
            biases = p != "voxtral"
            if p == "glma":
                self.norm_pre = (w.get("mm.a.norm_pre.weight", (e,)), w.get("mm.a.norm_pre.bias", (e,)))
                e_in = e * cfg.stack_factor
            self.mlp1 = w.get("mm.a.mlp.1.weight", (e_in,))
            self.mlp1_b = w.get("mm.a.mlp.1.bias", (self.mlp1.ne[1],), required=biases)
            self.mlp2 = w.get("mm.a.mlp.2.weight", (self.mlp1.ne[1],))
            self.mlp2_b = w.get("mm.a.mlp.2.bias", (self.mlp2.ne[1],), required=biases)
            self.n_embd_out = self.mlp2.ne[1]
            if p == "glma":
                self.boi = w.get("v.boi", (self.n_embd_out, 1))
                self.eoi = w.get("v.eoi", (self.n_embd_out, 1))
        else:
            self.fc = w.get("mm.a.fc.weight", (e,))
            self.fc_b = w.get("mm.a.fc.bias", (self.fc.ne[1],))
            self.n_embd_out = self.fc.ne[1]

    n_pos = N_FRAMES // 2

    def wrappers(self) -> tuple[str, str]:
        return WRAPPERS[self.cfg.projector]

    def mel_chunks(self, samples):
        return whisper_chunks(samples, self.cfg.n_mel)

    def chunk_frames(self, n_samples: int) -> list[int]:
        """Each chunk's mel frames for n_samples (what mel_chunks cuts), without computing them."""
        return whisper_chunk_frames(n_samples)

    def n_tokens(self, n_frames: int = N_FRAMES) -> int:
        """Embedding rows of one chunk: the graph's (see the module doc)."""
        n = n_frames // 2
        if self.cfg.projector in AVG_POOL:
            n //= 2
        if self.cfg.projector in STACKED or self.cfg.projector == "glma":
            n = -(-n // self.cfg.stack_factor)
        return n + 2 if self.cfg.projector == "glma" else n

    def build(self, g, n_frames: int = N_FRAMES):
        """One chunk's graph -> (inp_raw f32 [n_frames, n_mel], output [n_embd_out, n_tokens], {})."""
        cfg = self.cfg
        e = cfg.n_embd
        inp = g.input("inp_raw", ggml.F32, (n_frames, cfg.n_mel))
        x = g.gelu_erf(g.add(_conv1d_ph(g, self.conv1, inp, 1), self.conv1_b))     # [n_frames, e]
        x = g.gelu_erf(g.add(_conv1d_ph(g, self.conv2, x, 2), self.conv2_b))       # [n_pos, e]
        n_pos = x.ne[0]
        x = g.cont(g.transpose(x))                                                # [e, n_pos]
        x = g.add(x, g.view(self.pos, (e, n_pos), (self.pos.nb[1],), 0))
        x = vit.vit(g, x, self.blocks, n_head=cfg.n_head, eps=cfg.eps, ffn_op="gelu_erf",
                    kq_scale=1.0 / math.sqrt(e // cfg.n_head))
        if cfg.projector in AVG_POOL:         # AvgPool1d(2, 2) over positions: (a + b) / 2
            n_pos //= 2
            a = g.view(x, (e, n_pos), (2 * x.nb[1],), 0)
            b = g.view(x, (e, n_pos), (2 * x.nb[1],), x.nb[1])
            x = g.scale(g.add(a, b), 0.5)
        x = vit.norm(g, x, self.post_ln[0], self.post_ln[1], cfg.eps)
        if cfg.projector in STACKED:
            x = _stack(g, x, cfg.stack_factor)
        return inp, self._project(g, x), {}

    def _project(self, g, x):
        p = self.cfg.projector
        if p == "ultravox":
            x = g.mul(g.rms_norm(x, 1e-6), self.norm_pre)
            x = g.mul_mat(self.mlp1, x)
            h = x.ne[0] // 2                   # SwiGLU with silu on the second half
            first = g.view(x, (h, x.ne[1]), (x.nb[1],), 0)
            second = g.view(x, (h, x.ne[1]), (x.nb[1],), h * 4)
            x = g.swiglu(second, first)
            x = g.mul(g.rms_norm(x, 1e-6), self.norm_mid)
            return g.mul_mat(self.mlp2, x)
        if p == "glma":
            x = _stack(g, vit.norm(g, x, self.norm_pre[0], self.norm_pre[1], self.cfg.eps), self.cfg.stack_factor)
        if p in ("voxtral", "musicflamingo", "glma"):
            x = g.gelu_erf(vit.add(g, g.mul_mat(self.mlp1, x), self.mlp1_b))
            x = vit.add(g, g.mul_mat(self.mlp2, x), self.mlp2_b)
            return g.concat(g.concat(self.boi, x, 1), self.eoi, 1) if p == "glma" else x
        return g.add(g.mul_mat(self.fc, x), self.fc_b)


def _conv1d_ph(g, kernel, x, stride: int):
    """ggml_conv_1d_ph: im2col (f16) then one product; x [length, channels] -> [length', out channels]."""
    cols = g.im2col(kernel, x, stride, 0, kernel.ne[0] // 2, 0, 1, 0, False, ggml.F16)    # [k*c, length']
    y = g.mul_mat(g.reshape(cols, cols.ne[0], cols.ne[2] * cols.ne[1]),
                  g.reshape(kernel, kernel.ne[0] * kernel.ne[1], kernel.ne[2]))
    return g.reshape(y, cols.ne[1], kernel.ne[2], cols.ne[2])


def _stack(g, x, factor: int):
    """build_stack: [e, n] -> [e * factor, ceil(n / factor)], the tail zero padded."""
    e, n = x.ne[0], x.ne[1]
    total = e * n
    stride = e * factor
    padded = -(-total // stride) * stride
    if padded > total:
        x = g.pad(g.view(x, (total,)), padded - total)
    return g.view(x, (stride, padded // stride), (stride * 4,), 0)
