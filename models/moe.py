"""Mixture-of-experts feed-forward layers, routed as llama.cpp routes them.

ref: llama.cpp src/llama-graph.cpp, llm_graph_context::build_moe_ffn. A router
(`ffn_gate_inp`, optional bias) scores the experts per token; the gating turns
scores into probabilities (softmax, sigmoid, or none: softmax over the chosen
ones afterwards); the top-k experts are chosen (optionally on biased scores,
`exp_probs_b`); their weights are optionally normalised to sum 1 and scaled;
each chosen expert's FFN runs through ggml_mul_mat_id on its stacked weights
(`ffn_{gate,up,down}_exps`, optional per-expert biases) and the outputs are
summed weighted. Shared experts (`*_shexp`) are an ordinary FFN the model adds.
"""
from __future__ import annotations

from dataclasses import dataclass

from ggserve.models.registry import ModelError
from ggserve.models.weights import Weights

SOFTMAX = "softmax"                  # probabilities over all experts, then top-k
SIGMOID = "sigmoid"                  # independent sigmoid per expert
SOFTMAX_WEIGHT = "softmax_weight"    # top-k on raw scores, softmax over the chosen (gpt-oss)
# `expert_gating_func` in GGUF metadata (llama.cpp's llama_expert_gating_func_type)
GATING_SOFTMAX, GATING_SIGMOID, GATING_SOFTMAX_WEIGHT = 1, 2, 3
GATING_FUNCS = {GATING_SOFTMAX: SOFTMAX, GATING_SIGMOID: SIGMOID, GATING_SOFTMAX_WEIGHT: SOFTMAX_WEIGHT}

SILU = "silu"
SWIGLU_OAI = "swiglu_oai"            # gpt-oss: clamped SwiGLU, alpha 1.702, limit 7
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0    # ref: build_moe_ffn, LLM_FFN_SWIGLU_OAI_MOE

# the smallest normal f16: a weight sum is clamped to it before dividing (build_moe_ffn)
_MIN_WEIGHT_SUM = 6.103515625e-5


@dataclass
class Routing:
    n_expert: int
    n_used: int
    gating: str = SOFTMAX
    norm_weights: bool = False
    weights_scale: float = 0.0       # 0 or 1: unscaled
    act: str = SILU
    weight_before_ffn: bool = False  # llama4: the input is scaled by its weight before the FFN
    n_groups: int = 1                # DeepSeek V3: experts in groups, top-k within the best groups
    n_groups_used: int = 1

    @classmethod
    def from_hparams(cls, hp, path: str, default_gating: int) -> Routing:
        """DeepSeek-V3-style routing from llama.cpp's expert_* keys (gating function,
        weight normalisation and scale, expert groups); `default_gating` when the file
        names no gating function."""
        n_expert, n_used = hp.get("expert_count", 0), hp.get("expert_used_count", 0)
        if not n_expert or not n_used:
            raise ModelError(f"{path}: {hp.arch} needs expert_count and expert_used_count > 0")
        gating = GATING_FUNCS.get(hp.get("expert_gating_func", 0) or default_gating)
        if gating is None:
            raise ModelError(f"{path}: unknown {hp.arch}.expert_gating_func {hp.get('expert_gating_func')}")
        return cls(n_expert, n_used, gating=gating, norm_weights=bool(hp.get("expert_weights_norm", False)),
                   weights_scale=hp.get("expert_weights_scale", 0.0),
                   n_groups=hp.get("expert_group_count", 1) or 1,
                   n_groups_used=hp.get("expert_group_used_count", 1) or 1)


class Experts:
    """One layer's router and stacked expert weights, shapes checked against the
    expert count the metadata declares (a mismatch names the file and tensor)."""

    def __init__(self, w: Weights, il: int, n_embd: int, n_ff: int, n_expert: int, biases: bool = False,
                 probs_bias: bool = False):
        p = f"blk.{il}."
        self.gate_inp = _get(w, p + "ffn_gate_inp.weight", (n_embd, n_expert), n_expert)
        self.up = _get(w, p + "ffn_up_exps.weight", (n_embd, n_ff, n_expert), n_expert)
        self.gate = _get(w, p + "ffn_gate_exps.weight", (n_embd, n_ff, n_expert), n_expert)
        self.down = _get(w, p + "ffn_down_exps.weight", (n_ff, n_embd, n_expert), n_expert)
        self.gate_inp_b = self.up_b = self.gate_b = self.down_b = None
        if biases:
            self.gate_inp_b = _get(w, p + "ffn_gate_inp.bias", (n_expert,), n_expert)
            self.up_b = _get(w, p + "ffn_up_exps.bias", (n_ff, n_expert), n_expert)
            self.gate_b = _get(w, p + "ffn_gate_exps.bias", (n_ff, n_expert), n_expert)
            self.down_b = _get(w, p + "ffn_down_exps.bias", (n_embd, n_expert), n_expert)
        self.probs_b = _get(w, p + "exp_probs_b.bias", (n_expert,), n_expert) if probs_bias else None


def _get(w: Weights, name: str, shape: tuple, n_expert: int):
    t = w.get(name)
    ne = tuple(t.ne[:len(shape)])
    if ne[-1] != n_expert and ne[:-1] == shape[:-1]:
        raise ModelError(f"{w.path}: tensor {name!r} holds {ne[-1]} experts, the metadata says "
                         f"expert_count = {n_expert}")
    return w.get(name, shape)


def _best_groups(g, selection, r: Routing):
    """selection [n_expert, n_tokens] with the experts outside each token's n_groups_used
    best groups at -inf; a group's score is the sum of its two best selection scores.
    ref: build_moe_ffn's group-limited routing (DeepSeek V3's modeling_deepseek.py)."""
    n_tokens = selection.ne[1]
    per_group = r.n_expert // r.n_groups
    groups = g.reshape(selection, per_group, r.n_groups, n_tokens)
    top2 = g.argsort_top_k(groups, 2)                                   # i32 [2, n_groups, n_tokens]
    scores = g.get_rows(g.reshape(groups, 1, per_group, r.n_groups, n_tokens), top2)   # [1, 2, n_groups, n_tokens]
    scores = g.reshape(g.sum_rows(g.reshape(scores, 2, r.n_groups, n_tokens)), r.n_groups, n_tokens)
    best = g.argsort_top_k(scores, r.n_groups_used)                    # i32 [n_groups_used, n_tokens]
    kept = g.get_rows(groups, best)                                     # [per_group, n_groups_used, n_tokens]
    # llama.cpp's ggml_fill(groups, -inf): clamping to [-inf, -inf] gives the same tensor
    masked = g.set_rows(g.clamp(groups, float("-inf"), float("-inf")), kept, best)
    return g.reshape(masked, r.n_expert, n_tokens)


def moe_ffn(g, inp, x, E: Experts, r: Routing):
    """x: [n_embd, n_tokens] -> [n_embd, n_tokens], the weighted sum of the chosen experts."""
    n_embd, n_tokens = x.ne[0], x.ne[1]
    k = r.n_used
    logits = inp.mm(g, E.gate_inp, x)                                   # [n_expert, n_tokens]
    if E.gate_inp_b is not None:
        logits = g.add(logits, E.gate_inp_b)
    if r.gating == SOFTMAX:
        probs = g.soft_max(logits)
    elif r.gating == SIGMOID:
        probs = g.sigmoid(logits)
    else:
        probs = logits
    selection = probs if E.probs_b is None else g.add(probs, E.probs_b)
    if r.weight_before_ffn:
        selection = logits      # llama4 picks on the raw scores; sigmoid only weighs
    if r.n_groups > 1:
        selection = _best_groups(g, selection, r)
    chosen = g.argsort_top_k(selection, k)                              # i32 [k, n_tokens]
    weights = g.get_rows(g.reshape(probs, 1, r.n_expert, n_tokens), chosen)   # [1, k, n_tokens]
    if r.gating == SOFTMAX_WEIGHT:
        weights = g.reshape(g.soft_max(g.reshape(weights, k, n_tokens)), 1, k, n_tokens)
    if r.norm_weights:
        w2 = g.reshape(weights, k, n_tokens)
        total = g.clamp(g.sum_rows(w2), _MIN_WEIGHT_SUM, float("inf"))
        weights = g.reshape(g.div(w2, total), 1, k, n_tokens)
    if r.weights_scale not in (0.0, 1.0):
        weights = g.scale(weights, r.weights_scale)
    g.expand(weights)

    cur = g.reshape(x, n_embd, 1, n_tokens)
    if r.weight_before_ffn:
        cur = g.mul(g.repeat_4d(cur, n_embd, k, n_tokens), weights)
    up = g.mul_mat_id(E.up, cur, chosen)                                # [n_ff, k, n_tokens]
    if E.up_b is not None:
        up = g.add_id(up, E.up_b, chosen)
    gate = g.mul_mat_id(E.gate, cur, chosen)
    if E.gate_b is not None:
        gate = g.add_id(gate, E.gate_b, chosen)
    if r.act == SWIGLU_OAI:
        h = g.swiglu_oai(gate, up, OAI_ALPHA, OAI_LIMIT)
    else:
        h = g.swiglu(gate, up)
    out = g.mul_mat_id(E.down, h, chosen)                               # [n_embd, k, n_tokens]
    if E.down_b is not None:
        out = g.add_id(out, E.down_b, chosen)
    if not r.weight_before_ffn:
        out = g.mul(out, weights)
    g.expand(out)

    # the experts' outputs summed in order, as views (ggml adds them pairwise left to right)
    views = [g.view(out, (n_embd, n_tokens), (out.nb[2],), i * out.nb[1]) for i in range(k)]
    for v in views:
        g.expand(v)
    total = views[0]
    for v in views[1:]:
        total = g.add(total, v)
        g.expand(total)
    return g.cont(total) if k == 1 else total
