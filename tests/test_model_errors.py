"""Bad model files are clear Python exceptions naming the file, never a crash."""
import shutil

import pytest

from ggserve.models.registry import ModelError
from ggserve.native.gguf_file import GGUFError
from ggserve.server.engine.engine import EngineConfig, Engine


def test_missing_file(tmp_path):
    path = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        Engine(EngineConfig(str(path)))


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "text.gguf"
    path.write_text("hello, I am not a model\n" * 10)
    with pytest.raises(GGUFError, match="text.gguf.*not a GGUF file"):
        Engine(EngineConfig(str(path)))


def test_truncated_gguf(tmp_path, smollm2_path):
    path = tmp_path / "truncated.gguf"
    with open(smollm2_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(20_000_000))
    with pytest.raises(GGUFError, match="truncated.gguf.*truncated"):
        Engine(EngineConfig(str(path)))


def test_header_cut_short(tmp_path, smollm2_path):
    path = tmp_path / "header.gguf"
    with open(smollm2_path, "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(1000))
    with pytest.raises(GGUFError, match="header.gguf"):
        Engine(EngineConfig(str(path)))


def test_unknown_architecture(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="mamba.gguf.*unsupported architecture 'mamba'"):
        Engine(EngineConfig(str(path)))


def test_missing_tensor_is_named(tmp_path, smollm2_path):
    gguf = pytest.importorskip("gguf")
    from ggserve.native.gguf_file import GGUFFile

    src = GGUFFile(smollm2_path)
    path = tmp_path / "no_ffn.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in src.metadata.items():
        if key.startswith("llama.") and isinstance(value, int):
            w.add_uint32(key, value)
        elif key.startswith("llama.") and isinstance(value, float):
            w.add_float32(key, value)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(src.metadata["tokenizer.ggml.tokens"])
    w.add_token_merges(src.metadata["tokenizer.ggml.merges"])
    w.add_token_types([int(t) for t in src.metadata["tokenizer.ggml.token_type"]])
    import numpy as np

    n_embd = src.metadata["llama.embedding_length"]
    w.add_tensor("token_embd.weight", np.zeros((len(src.metadata["tokenizer.ggml.tokens"]), n_embd), np.float32))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelError, match="no_ffn.gguf.*missing tensor 'blk.0.attn_norm.weight'"):
        Engine(EngineConfig(str(path)))
