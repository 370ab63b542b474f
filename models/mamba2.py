"""Mamba-2 layers (the SSM blocks of Granite 4 and Nemotron-H), as llama.cpp builds them.

ref: llama.cpp src/models/graph-context-mamba.cpp (build_mamba2_layer); ggml's
ggml_ssm_conv and ggml_ssm_scan.

`ssm_in` projects a layer's input to z | xBC | dt. xBC (x, then B and C of
`ssm.group_count` groups of `ssm.state_size`) goes through a causal depthwise
convolution of `ssm.conv_kernel` taps with a bias (state: the last d_conv - 1
inputs of each channel), then SiLU. The selective scan runs over n_head =
`ssm.time_step_rank` heads of head_dim = d_inner / n_head (state: d_state x
head_dim per head) with dt + `ssm_dt.bias` and `ssm_a`; y + x * `ssm_d` is gated by
SiLU(z), RMS-normed per group (`ssm_norm`) and projected by `ssm_out`.
"""
from __future__ import annotations

from ggserve.models.hparams import HParams
from ggserve.models.memory import LayerRecurrent, equal_blocks
from ggserve.models.registry import ModelError

F32 = 4     # bytes


class Mamba2:
    """A model's Mamba-2 dimensions, the weights of one such layer, and its graph."""

    def __init__(self, hp: HParams, n_embd: int, eps: float, path: str = ""):
        self.n_embd, self.eps = n_embd, eps
        self.d_conv = hp.get("ssm.conv_kernel", required=True)
        self.d_inner = hp.get("ssm.inner_size", required=True)
        self.d_state = hp.get("ssm.state_size", required=True)
        self.n_head = hp.get("ssm.time_step_rank", required=True)
        self.n_group = hp.get("ssm.group_count", required=True)
        if not self.n_head or self.d_inner % self.n_head or not self.n_group or self.d_inner % self.n_group:
            raise ModelError(f"{path}: {hp.arch}.ssm.inner_size must split into time_step_rank heads "
                             f"and group_count groups")
        self.head_dim = self.d_inner // self.n_head
        self.conv_dim = self.d_inner + 2 * self.n_group * self.d_state           # x | B | C
        self.d_in_proj = self.d_inner + self.conv_dim + self.n_head              # z | xBC | dt

    def weights(self) -> list:
        """The layer's tensors (blocks.Layer table rows)."""
        e, c, h = self.n_embd, self.conv_dim, self.n_head
        return [("ssm_in", "ssm_in.weight", (e, self.d_in_proj), True),
                ("ssm_conv", "ssm_conv1d.weight", (self.d_conv, c), True),
                ("ssm_conv_b", "ssm_conv1d.bias", (c,), True),
                ("ssm_dt_b", "ssm_dt.bias", (h,), True),
                ("ssm_a", "ssm_a", (1, h), True),
                ("ssm_d", "ssm_d", (1, h), True),
                ("ssm_norm", "ssm_norm.weight", (self.d_inner // self.n_group,), True),
                ("ssm_out", "ssm_out.weight", (self.d_inner, e), True)]

    def memory(self, device) -> LayerRecurrent:
        """Per sequence: the last d_conv - 1 inputs of each conv channel, and the scan's
        [d_state, head_dim] state per head."""
        return LayerRecurrent(((self.d_conv - 1) * self.conv_dim, self.d_state * self.d_inner), device)

    def forward(self, g, inp, il, L, h):
        """Normed h [n_embd, n_tokens] -> the layer's output [n_embd, n_tokens]."""
        n = inp.n_tokens
        zxbcdt = inp.mm(g, L.ssm_in, h)                                    # [d_in_proj, n]
        nb = zxbcdt.nb[1]
        conv_states = inp.recurrent.state(g, il, 0)                        # [(d_conv - 1) * conv_dim, n_seqs]
        ssm_all, ssm_rows = inp.recurrent.rows(g, il, 1)                   # [d_state * d_inner, n_rows], [n_seqs]
        ssm_all = g.reshape(ssm_all, self.d_state, self.head_dim, self.n_head, ssm_all.ne[1])
        outs, new_conv, new_ssm = [], [], []
        # one scan per run of sequences with as many rows each (llama.cpp's equal split)
        for r0, nt, s0, ns in equal_blocks(inp.seq_rows):
            y, conv, ssm = self._block(g, L, zxbcdt, conv_states, ssm_all, ssm_rows, r0, nt, s0, ns)
            outs.append(y)
            new_conv.append(conv)
            new_ssm.append(ssm)
        inp.recurrent.store(g, il, 0, _join(g, new_conv))
        inp.recurrent.store(g, il, 1, _join(g, new_ssm))
        z = g.cont(g.view(zxbcdt, (self.d_inner, n), (nb,), 0))
        y = g.swiglu(z, _join(g, outs))                                    # silu(z) * y  [d_inner, n]
        y = g.reshape(y, self.d_inner // self.n_group, self.n_group, n)   # grouped RMS norm
        y = g.reshape(g.mul(g.rms_norm(y, self.eps), L.ssm_norm), self.d_inner, n)
        return inp.mm(g, L.ssm_out, y)

    def _block(self, g, L, zxbcdt, conv_states, ssm_all, ssm_rows, r0, nt, s0, ns):
        """ns sequences of nt rows each, from batch row r0 and state row s0 -> (y
        [d_inner, nt * ns] before the gate, conv states, scan states [size, ns])."""
        k, c, hd, nh, ds, ng = self.d_conv - 1, self.conv_dim, self.head_dim, self.n_head, self.d_state, self.n_group
        nb = zxbcdt.nb[1]
        xbc = g.view(zxbcdt, (c, nt, ns), (nb, nb * nt), r0 * nb + self.d_inner * F32)
        dt = g.view(zxbcdt, (nh, nt, ns), (nb, nb * nt), r0 * nb + (self.d_inner + c) * F32)
        prev = g.view(conv_states, (k, c, ns), (k * F32, conv_states.nb[1]), s0 * conv_states.nb[1])
        conv_x = g.concat(prev, g.transpose(xbc), 0)                       # [d_conv - 1 + nt, conv_dim, ns]
        conv_next = g.view(conv_x, (k, c, ns), (conv_x.nb[1], conv_x.nb[2]), nt * F32)
        xbc = g.silu(g.add(g.ssm_conv(conv_x, L.ssm_conv), L.ssm_conv_b))  # [conv_dim, nt, ns]
        x = g.view(xbc, (hd, nh, nt, ns), (hd * F32, xbc.nb[1], xbc.nb[2]), 0)
        B = g.view(xbc, (ds, ng, nt, ns), (ds * F32, xbc.nb[1], xbc.nb[2]), self.d_inner * F32)
        C = g.view(xbc, (ds, ng, nt, ns), (ds * F32, xbc.nb[1], xbc.nb[2]), (self.d_inner + ng * ds) * F32)
        dt = g.add(g.cont(dt), L.ssm_dt_b)                                 # [n_head, nt, ns]
        ids = g.view(ssm_rows, (ns,), (), s0 * F32)
        res = g.ssm_scan(ssm_all, x, dt, L.ssm_a, B, C, ids)
        rows = nt * ns
        y = g.view(res, (hd, nh, nt, ns), (hd * F32, hd * nh * F32, hd * nh * nt * F32), 0)
        y = g.add(y, g.mul(x, L.ssm_d))                                    # the D skip
        size = ds * self.d_inner
        ssm_next = g.view(res, (size, ns), (size * F32,), self.d_inner * rows * F32)
        return (g.reshape(y, self.d_inner, rows), g.reshape(g.cont(conv_next), k * c, ns), ssm_next)


def _join(g, parts):
    """Concatenate 2-D tensors along their columns (one part: as it is)."""
    out = parts[0]
    for p in parts[1:]:
        out = g.concat(out, p, 1)
    return out
