"""Weights declared by their GGUF names, looked up with clear errors."""
from __future__ import annotations

from ggserve.models.registry import ModelError


class Weights:
    """Tensor lookup by GGUF name ('blk.3.attn_q.weight') with shape checks."""

    def __init__(self, tensors: dict, path: str = ""):
        self.tensors = tensors
        self.path = path

    def get(self, name: str, shape: tuple | None = None, required: bool = True):
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise ModelError(f"{self.path}: missing tensor {name!r}")
            return None
        if shape is not None and tuple(t.ne[: len(shape)]) != tuple(shape):
            raise ModelError(f"{self.path}: tensor {name!r} has shape {t.ne[:len(shape)]}, expected {tuple(shape)}")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def embeddings_and_output(self, model, tied_output: bool = True) -> None:
        """Set model.n_vocab, tok_embd, output_norm and output; the output matrix is the
        token embeddings when the file ties them (and tied_output allows it)."""
        model.n_vocab = self.get("token_embd.weight").ne[1]
        model.tok_embd = self.get("token_embd.weight", (model.n_embd, model.n_vocab))
        model.output_norm = self.get("output_norm.weight", (model.n_embd,))
        output = self.get("output.weight", (model.n_embd, model.n_vocab), required=not tied_output)
        model.output = model.tok_embd if output is None else output


# Weights that enter the models only as the matrix of a mul_mat: the ones ggml's
# CPU backend may repack into its interleaved layouts (llama.cpp does, so must we
# to round as it does). Not token_embd: it is read with get_rows.
_MATMUL_PARTS = ("attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output",
                 "ffn_gate", "ffn_up", "ffn_down", "ffn_gate_inp",
                 "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp",
                 # MLA (deepseek2) projections; not attn_k_b / attn_v_b: per-head 3-D stacks
                 "attn_q_a", "attn_q_b", "attn_kv_a_mqa",
                 # stacked experts, multiplied by mul_mat_id (repacked as llama.cpp repacks them)
                 "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps",
                 # gated delta net (qwen35): output gate z, decay, write strength, output
                 "attn_gate", "ssm_alpha", "ssm_beta", "ssm_out",
                 # qwen3next: beta and alpha in one matrix
                 "ssm_ba",
                 # Mamba-2's input projection (not ssm_conv1d: the kernel of ssm_conv)
                 "ssm_in",
                 # lfm2's short-conv layers (not shortconv.conv: the kernel of ssm_conv)
                 "shortconv.in_proj", "shortconv.out_proj",
                 # gemma4's per-layer embeddings: gate and projection of each layer
                 "inp_gate", "proj")


def matmul_weight_names(names) -> set[str]:
    out = set()
    for name in names:
        parts = name.split(".")
        if name == "output.weight" or (len(parts) >= 4 and parts[0] == "blk" and ".".join(parts[2:-1]) in
                                       _MATMUL_PARTS and parts[-1] == "weight"):
            out.add(name)
    return out
