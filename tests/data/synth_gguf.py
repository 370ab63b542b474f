"""What the tiny random-weight GGUF writers (tests/data/*/make_model.py) share: the
per-tensor seeded weights, the tied embedding whose final-norm gain sets the logits'
scale, a BPE vocabulary copied from a synthetic golden model, and writing the file
(norms and biases F32, the rest quantized with gguf.quants as llama-quantize would).
Each make_model.py keeps its own shapes, hyperparameters and tensor list."""
from __future__ import annotations

import zlib

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q


def rng(arch: str, name: str):
    """The generator of one tensor: seeded with crc32("<arch>/<name>")."""
    return np.random.default_rng(zlib.crc32(f"{arch}/{name}".encode()))


class Tensors:
    def __init__(self, arch: str, bias_std: float = 0.1):
        self.arch, self.bias_std = arch, bias_std
        self.items = []      # (name, f32 array in numpy order = reversed ggml ne, ggml type)

    def rng(self, name: str):
        return rng(self.arch, name)

    def add(self, name, arr, qtype=Q.F32):
        self.items.append((name, np.ascontiguousarray(arr, dtype=np.float32), qtype))

    def mat(self, name, ne, fan_in=None, scale=1.0, qtype=Q.Q8_0):
        """~ N(0, (scale / sqrt(fan_in))^2), fan_in ne[0] unless given."""
        fan_in = fan_in or ne[0]
        a = self.rng(name).standard_normal(tuple(reversed(ne)), dtype=np.float32) * np.float32(scale / np.sqrt(fan_in))
        self.add(name, a, qtype)

    def norm(self, name, n, center=1.0, spread=0.1):
        self.add(name, center + spread * self.rng(name).standard_normal(n, dtype=np.float32))

    def bias(self, name, n, std=None):
        self.add(name, (self.bias_std if std is None else std) * self.rng(name).standard_normal(n, dtype=np.float32))

    def tied_embedding(self, n_vocab: int, n_embd: int, embd_std: float, row_tail: float, logit_std: float) -> float:
        """A small token_embd (Q4_0, heavy-tailed row norms); returns the final-norm gain that
        gives the logits a std of about logit_std."""
        r = self.rng("token_embd.weight")
        emb = r.standard_normal((n_vocab, n_embd), dtype=np.float32)
        emb *= np.exp(row_tail * r.standard_normal((n_vocab, 1))).astype(np.float32) * np.float32(embd_std)
        self.add("token_embd.weight", emb, Q.Q4_0)
        return logit_std / (float(np.sqrt(np.mean(np.square(emb), dtype=np.float64))) * np.sqrt(n_embd))


def copy_bpe_vocab(w: gguf.GGUFWriter, source: str, unk: bool = True) -> int:
    """The BPE vocabulary of the GGUF at source (tokens, types, merges, bos/eos, unk if
    unk); returns its size."""
    from ggserve.native.gguf_file import GGUFFile  # fast reader (gguf.GGUFReader is slow on a vocab)
    m = GGUFFile(source).metadata
    w.add_tokenizer_model(m["tokenizer.ggml.model"])
    w.add_tokenizer_pre(m["tokenizer.ggml.pre"])
    w.add_token_list(m["tokenizer.ggml.tokens"])
    w.add_token_types([int(t) for t in m["tokenizer.ggml.token_type"]])
    w.add_token_merges(m["tokenizer.ggml.merges"])
    w.add_bos_token_id(m["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(m["tokenizer.ggml.eos_token_id"])
    if unk:
        w.add_unk_token_id(m["tokenizer.ggml.unknown_token_id"])
    return len(m["tokenizer.ggml.tokens"])


def writer(path: str, arch: str, name: str) -> gguf.GGUFWriter:
    """A GGUF writer for arch with the file's name and its Q8_0 file type."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return w


def write(w: gguf.GGUFWriter, tensors: Tensors) -> None:
    """The tensors (quantized where not F32) after the metadata already added; closes w."""
    for name, arr, qtype in tensors.items:
        if qtype == Q.F32:
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
