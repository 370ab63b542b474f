"""A dense issue-16 model file that lacks a tensor, has one of the wrong shape or asks
for what is not implemented is a ModelError naming the file and the tensor or key,
raised while the model is built from the file's metadata and tensor table (as the
loader builds it, before anything runs)."""
import pytest

from ggserve.models.registry import ModelError, model_class
from ggserve.native.gguf_file import GGUFFile, TensorInfo
from synth_golden import model_path


def _build(arch, drop=(), reshape=None, meta_changes=None):
    path = model_path(arch)
    f = GGUFFile(path)
    meta = {**f.metadata, **(meta_changes or {})}
    tensors = {name: t for name, t in f.tensors.items() if name not in drop}
    if reshape:
        name, ne = reshape
        t = tensors[name]
        tensors[name] = TensorInfo(name, t.ggml_type, ne, t.offset, t.nbytes)
    return model_class(arch, path)(meta, tensors, path)


@pytest.mark.parametrize("arch,tensor", [
    ("qwen3", "blk.2.attn_k_norm.weight"),
    ("phi3", "blk.1.attn_qkv.weight"),
    ("mistral3", "blk.3.ffn_gate.weight"),
    ("gemma4", "rope_freqs.weight"),           # needed by its global layer
    ("gemma4", "blk.0.post_ffw_norm.weight"),
])
def test_missing_tensor_names_file_and_tensor(arch, tensor):
    with pytest.raises(ModelError, match=rf"synth-{arch}-.*\.gguf: missing tensor '{tensor}'"):
        _build(arch, drop={tensor})


@pytest.mark.parametrize("arch", ["qwen3", "phi3", "mistral3", "gemma4"])
def test_every_dense_synth_file_builds(arch):
    assert _build(arch).n_layer >= 3


def test_misshapen_fused_ffn_names_file_and_tensor():
    # phi3's ffn_up holds gate and up: [n_embd, 2 * n_ff]
    with pytest.raises(ModelError, match=r"synth-phi3-.*\.gguf: tensor 'blk.0.ffn_up.weight' has shape "
                                         r"\(256, 256\), expected \(256, 512\)"):
        _build("phi3", reshape=("blk.0.ffn_up.weight", (256, 256, 1, 1)))


def test_gemma4_moe_layers_are_refused_by_name():
    # per-layer embeddings and shared KV layers (E2B/E4B): tests/test_engine_synth_gemma4e.py
    with pytest.raises(ModelError, match=r"synth-gemma4-.*\.gguf: Gemma 4 with gemma4\.expert_count = 2 is not supported"):
        _build("gemma4", meta_changes={"gemma4.expert_count": 2})


def test_mistral3_temperature_without_original_context_is_refused():
    with pytest.raises(ModelError, match=r"synth-mistral3-.*\.gguf: attention temperature scaling needs "
                                         r"rope.scaling.original_context_length"):
        _build("mistral3", meta_changes={"mistral3.rope.scaling.original_context_length": 0,
                                         "mistral3.context_length": 0})
