"""Gemma 4's audio encoder (gemma4a): a conformer over 30 s log-mel pieces.

ref: llama.cpp tools/mtmd/models/gemma4a.cpp, clip.cpp (the gemma4a tensors, its inputs
kq_mask and pos_emb, clip_n_output_tokens), mtmd-audio.cpp (the gemma4a preprocessor).

  mel [128, T] -> 2x (conv2d k3 s2 p1 -> LayerNorm over channels -> ReLU) -> flatten
  (channels x freq) -> input projection                                [e, T/4]
  -> conformer blocks: half-step SiLU FFN; chunked local self-attention (blocks of 12
     queries over the 12 positions before them and their own block, causal, with
     relative-position scores from 13 sinusoids, softcap 50); a conv module (GLU, causal
     depthwise conv k5, RMS norm, SiLU); half-step FFN; RMS norm
  -> pre_encode.out (+b) -> RMS norm (* soft_emb_norm) -> mm.a.input_projection
The conv module's two norms are stored under each other's names (conv_norm is the one
before the pointwise conv), as llama.cpp loads them.
"""
from __future__ import annotations

import functools

import numpy as np

from ggserve.models.audio.mel import _LIBM, gemma4_chunk_frames, gemma4_chunks
from ggserve.models.vision import vit
from ggserve.native import ggml

FAMILIES = ("gemma4a",)
CHUNK = 12            # queries per attention block
PAST = 12             # positions a query sees before its block
CONTEXT = CHUNK + PAST
N_RPE = PAST + 1
EPS = 1e-6            # llama.cpp hardcodes it (the converted files carry a wrong value)
SOFTCAP = 50.0
CONV_K = 5


class _Layer:
    def __init__(self, w, i: int, e: int, f: int):
        p = f"a.blk.{i}."

        def get(name, shape=None, required=True):
            return w.get(p + name + ".weight", shape, required=required)
        self.ffn_norm, self.ffn_up = get("ffn_norm", (e,)), get("ffn_up", (e, f))
        self.ffn_down = get("ffn_down", (f, e))
        self.ffn_post_norm = get("ffn_post_norm", (e,), False)
        self.attn_norm = get("attn_pre_norm", (e,), False)
        if self.attn_norm is None:
            self.attn_norm = get("ln1", (e,), False)
        self.wq, self.wk, self.wv, self.wo = (get(n, (e, e)) for n in ("attn_q", "attn_k", "attn_v", "attn_out"))
        self.bo = w.get(p + "attn_out.bias", (e,), required=False)
        self.per_dim_scale = get("per_dim_scale", None, False)
        self.per_dim_k_scale = get("per_dim_k_scale", None, False)
        self.k_rel = get("attn_k_rel", (e, e), False)
        self.attn_post_norm = get("attn_post_norm", (e,), False)
        self.conv_pre_norm = get("conv_norm", (e,))          # llama.cpp's norm_conv_w
        self.pw1 = get("conv_pw1", (e, 2 * e))
        self.dw = get("conv_dw", (CONV_K, e))
        self.dw_b = w.get(p + "conv_dw.bias", (e,), required=False)
        self.conv_post_norm = get("norm_conv", (e,), False)   # llama.cpp's conv_norm_w
        self.pw2 = get("conv_pw2", (e, e))
        self.ffn1_norm, self.ffn1_up, self.ffn1_down = (get("ffn_norm_1", (e,)), get("ffn_up_1", (e, f)),
                                                        get("ffn_down_1", (f, e)))
        self.ffn1_post_norm = get("ffn_post_norm_1", (e,), False)
        self.out_norm = get("ln2", (e,), False)


class Gemma4AudioEncoder:
    def __init__(self, cfg, w):
        self.cfg = cfg
        clamped = sorted(n for n in w.tensors if n.endswith((".input_max", ".input_min", ".output_max", ".output_min")))
        if clamped:      # clip.cpp's ClippableLinear: the products' inputs and outputs clamped; not built here
            raise ValueError(f"clamped linear layers ({clamped[0]}, ...) are not supported yet")
        e = cfg.n_embd
        self.convs = [(w.get(f"a.conv1d.{i}.weight"), w.get(f"a.conv1d.{i}.bias", required=False),
                       w.get(f"a.conv1d.{i}.norm.weight", required=False)) for i in range(2)]
        self.inp_proj = w.get("a.input_projection.weight")
        self.inp_proj_b = w.get("a.input_projection.bias", required=False)
        self.layers = [_Layer(w, i, e, cfg.n_ff) for i in range(cfg.n_layer)]
        self.out_proj = w.get("a.pre_encode.out.weight", required=False)
        self.out_proj_b = w.get("a.pre_encode.out.bias", required=False)
        self.soft_emb_norm = w.get("mm.a.soft_emb_norm.weight", required=False)
        self.mm_proj = w.get("mm.a.input_projection.weight", required=False)
        last = self.mm_proj if self.mm_proj is not None else self.out_proj
        self.n_embd_out = last.ne[1] if last is not None else e

    def wrappers(self) -> tuple[str, str]:
        return "<|audio>", "<audio|>"

    def mel_chunks(self, samples):
        return gemma4_chunks(samples, self.cfg.n_mel, self.cfg.sample_rate)

    def chunk_frames(self, n_samples: int) -> list[int]:
        """Each chunk's mel frames for n_samples (what mel_chunks cuts), without computing them."""
        return gemma4_chunk_frames(n_samples, self.cfg.sample_rate)

    @staticmethod
    def n_tokens(n_frames: int = 3000) -> int:
        """Two stride-2 convolutions: ceil halvings."""
        for _ in range(2):
            n_frames = (n_frames - 1) // 2 + 1
        return n_frames

    def build(self, g, n_frames: int = 3000):
        """One piece's graph -> (inp_raw f32 [n_frames, n_mel], output [n_embd_out, n_tokens], inputs)."""
        cfg = self.cfg
        inp = g.input("inp_raw", ggml.F32, (n_frames, cfg.n_mel))
        x = g.cont(g.transpose(inp))                                          # [n_mel, T]
        for kernel, bias, norm_w in self.convs:
            x = g.conv_2d(kernel, x, 2, 2, 1, 1, 1, 1)                        # [freq, time, ch]
            if bias is not None:
                x = g.add(x, bias)
            if norm_w is not None:                                            # LayerNorm over channels
                x = g.cont(g.permute(x, 1, 2, 0, 3))
                x = g.mul(g.norm(x, EPS), norm_w)
                x = g.cont(g.permute(x, 2, 0, 1, 3))
            x = g.relu(x)
        x = g.cont(g.permute(x, 1, 2, 0, 3))                                  # [ch, freq, time]
        x = g.reshape(x, x.ne[0] * x.ne[1], x.ne[2])
        x = vit.add(g, g.mul_mat(self.inp_proj, x), self.inp_proj_b)          # [e, n_pos]
        n_pos = x.ne[1]
        n_blocks = -(-n_pos // CHUNK)
        pos_emb = g.input("pos_emb", ggml.F32, (cfg.n_embd, N_RPE))
        mask = g.input("kq_mask", ggml.F32, (CONTEXT, CHUNK, n_blocks))
        zeros = g.input("kv_left_pad", ggml.F32, (cfg.n_embd // cfg.n_head, cfg.n_head, PAST))
        conv_pad = g.input("conv_left_pad", ggml.F32, (CONV_K - 1, cfg.n_embd))
        for layer in self.layers:
            x = self._block(g, layer, x, n_pos, pos_emb, mask, zeros, conv_pad)
        if self.out_proj is not None:
            x = vit.add(g, g.mul_mat(self.out_proj, x), self.out_proj_b)
        x = g.rms_norm(x, EPS)
        if self.soft_emb_norm is not None:
            x = g.mul(x, self.soft_emb_norm)
        if self.mm_proj is not None:
            x = g.mul_mat(self.mm_proj, x)
        d = cfg.n_embd // cfg.n_head
        return inp, x, {pos_emb: rpe_sinusoids(cfg.n_embd), mask: block_mask(n_pos),
                        zeros: np.zeros((PAST, cfg.n_head, d), np.float32),
                        conv_pad: np.zeros((cfg.n_embd, CONV_K - 1), np.float32)}

    def _block(self, g, L, x, n_pos, pos_emb, mask, zeros, conv_pad):
        def norm(t, w):
            return g.mul(g.rms_norm(t, EPS), w)

        def half_ffn(t, nw, up, down, post):
            h = vit.ffn(g, norm(t, nw), up, None, None, None, down, None, "silu")
            if post is not None:
                h = norm(h, post)
            return g.add(t, g.scale(h, 0.5))

        res = half_ffn(x, L.ffn_norm, L.ffn_up, L.ffn_down, L.ffn_post_norm)
        a = self._attention(g, L, norm(res, L.attn_norm) if L.attn_norm is not None else res, n_pos,
                            pos_emb, mask, zeros)
        if L.attn_post_norm is not None:
            a = norm(a, L.attn_post_norm)
        res = g.add(res, a)
        res = g.add(res, self._conv(g, L, norm(res, L.conv_pre_norm), conv_pad))
        res = half_ffn(res, L.ffn1_norm, L.ffn1_up, L.ffn1_down, L.ffn1_post_norm)
        return norm(res, L.out_norm) if L.out_norm is not None else res

    def _attention(self, g, L, x, n_pos, pos_emb, mask, zeros):
        h = self.cfg.n_head
        d = self.cfg.n_embd // h
        n_blocks = -(-n_pos // CHUNK)
        ln2 = np.float32(_LIBM.logf(2.0))
        q_scale = float(np.float32(np.float32(1.0) / np.sqrt(np.float32(d))) / ln2)
        k_scale = float(np.float32(_LIBM.logf(float(np.float32(1.0) + np.float32(_LIBM.expf(1.0))))) / ln2)
        q = g.scale(g.reshape(g.mul_mat(L.wq, x), d, h, n_pos), q_scale)
        if L.per_dim_scale is not None:
            q = g.mul(q, g.reshape(L.per_dim_scale, d, 1, 1))
        k = g.scale(g.reshape(g.mul_mat(L.wk, x), d, h, n_pos), k_scale)
        if L.per_dim_k_scale is not None:
            k = g.mul(k, g.reshape(L.per_dim_k_scale, d, 1, 1))
        v = g.reshape(g.mul_mat(L.wv, x), d, h, n_pos)
        q = g.pad(q, 0, 0, n_blocks * CHUNK - n_pos)
        q = g.cont(g.permute(g.reshape(q, d, h, CHUNK, n_blocks), 0, 3, 1, 2))    # [d, C, B, h]

        def blocks(t):           # each block's context: the PAST positions before it and its own
            t = g.pad(g.concat(zeros, t, 2), 0, 0, CONTEXT * n_blocks - n_pos - PAST)
            t = g.view(t, (d, h, CONTEXT, n_blocks), (t.nb[1], t.nb[2], CHUNK * t.nb[2]), 0)
            return g.cont(t)                                                   # [d, h, S, B]
        kb = g.cont(g.permute(blocks(k), 0, 3, 1, 2))                          # [d, S, B, h]
        vb = g.cont(g.permute(blocks(v), 1, 3, 0, 2))                          # [S, d, B, h]
        scores = g.mul_mat(kb, q)                                              # [S, C, B, h]
        if L.k_rel is not None:
            p = g.reshape(g.mul_mat(L.k_rel, pos_emb), d, h, N_RPE)
            p = g.cont(g.permute(p, 0, 2, 1, 3))                               # [d, R, h]
            bd = g.mul_mat(p, g.reshape(q, d, CHUNK * n_blocks, h))            # [R, C*B, h]
            bd = g.reshape(bd, N_RPE, CHUNK, n_blocks, h)
            bd = g.pad(bd, CONTEXT + 1 - N_RPE)                                # relative shift (Transformer-XL)
            bd = g.reshape(bd, (CONTEXT + 1) * CHUNK, n_blocks, h)
            bd = g.cont(g.view(bd, (CHUNK * CONTEXT, n_blocks, h), (bd.nb[1], bd.nb[2]), 0))
            scores = g.add(scores, g.reshape(bd, CONTEXT, CHUNK, n_blocks, h))
        scores = g.scale(g.tanh(g.scale(scores, 1.0 / SOFTCAP)), SOFTCAP)
        attn = g.soft_max(g.add(scores, mask))
        out = g.mul_mat(vb, attn)                                              # [d, C, B, h]
        out = g.cont(g.permute(out, 0, 2, 3, 1))
        out = g.reshape(out, d * h, CHUNK * n_blocks)
        if n_blocks * CHUNK > n_pos:
            out = g.cont(g.view(out, (d * h, n_pos), (out.nb[1],), 0))
        return vit.add(g, g.mul_mat(L.wo, out), L.bo)

    def _conv(self, g, L, x, pad):
        e = x.ne[0]
        y = g.mul_mat(L.pw1, x)                                                # [2e, n]
        gate = g.sigmoid(g.cont(g.view(y, (e, y.ne[1]), (y.nb[1],), e * 4)))
        y = g.cont(g.transpose(g.mul(g.view(y, (e, y.ne[1]), (y.nb[1],), 0), gate)))   # [n, e]
        y = g.concat(pad, y, 0)                                                # causal: 4 zeros before
        y = g.ssm_conv(y, L.dw)                                                # [e, n]
        y = vit.add(g, y, L.dw_b)
        if L.conv_post_norm is not None:
            y = g.mul(g.rms_norm(y, EPS), L.conv_post_norm)
        return g.mul_mat(L.pw2, g.silu(y))


def block_mask(n_pos: int) -> np.ndarray:
    """f32 [n_blocks, CHUNK, CONTEXT]: 0 where a query sees a key (causal, within PAST), else -1e9."""
    n_blocks = -(-n_pos // CHUNK)
    b, q, k = np.meshgrid(np.arange(n_blocks), np.arange(CHUNK), np.arange(CONTEXT), indexing="ij")
    gq, gk = b * CHUNK + q, b * CHUNK - PAST + k
    ok = (gq < n_pos) & (gk >= 0) & (gk < n_pos) & (gk <= gq) & (gq - gk < PAST)
    return np.where(ok, np.float32(0.0), np.float32(-1e9)).astype(np.float32)


@functools.cache
def rpe_sinusoids(n_embd: int) -> np.ndarray:
    """f32 [N_RPE, n_embd]: sin | cos of positions PAST .. 0, as llama.cpp fills pos_emb (float libm).
    Made once per width: its loop of libm calls holds the GIL (30 ms at Gemma 4's 1536), and
    every chunk is encoded on a worker thread beside the engine's."""
    half = n_embd // 2
    inc = np.float32(_LIBM.logf(10000.0)) / np.float32(max(half - 1, 1))
    out = np.zeros((N_RPE, n_embd), np.float32)
    for p in range(N_RPE):
        pos = np.float32(PAST - p)
        for i in range(half):
            inv = np.float32(_LIBM.expf(float(-np.float32(i) * inc)))
            s = float(pos * inv)
            out[p, i], out[p, i + half] = _LIBM.sinf(s), _LIBM.cosf(s)
    out.flags.writeable = False
    return out
