"""What an mmproj's encoders share, vision (models/vision/) and audio (models/audio/).

ref: llama.cpp tools/mtmd/clip.cpp (clip_model_loader: one `clip` GGUF holds a vision
encoder, an audio encoder or both, each with its `clip.<modality>.*` keys and tensors).

An encoder's weights live in backend buffers loaded from the file; each input (an image
tile, an audio chunk) is one graph computed on that backend, its output read back or
copied to the device where the text model takes it. A family says how to build the graph
for one input (`MmprojEncoder._graph`); loading, the buffers' lifetime and running the
graph are here, once.
"""
from __future__ import annotations

import os

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFError, GGUFFile


def u32(meta: dict, key: str, path: str, default=None) -> int:
    """An integer metadata value (or `default` when absent); ModelError naming the file."""
    v = meta.get(key, default)
    if v is None:
        raise ModelError(f"{path}: missing metadata {key!r}")
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ModelError(f"{path}: metadata {key!r} is not an integer ({v!r})") from None


def open_gguf(path) -> GGUFFile:
    """An mmproj file's header and tensor index; ModelError naming the file when it cannot be read."""
    path = os.fspath(path)
    try:
        return GGUFFile(path)
    except FileNotFoundError:
        raise ModelError(f"{path}: mmproj file not found") from None
    except (GGUFError, OSError) as e:
        msg = str(e)
        raise ModelError(msg if path in msg else f"{path}: {msg}") from None


class MmprojEncoder:
    """An encoder + projector whose weights are backend buffers: one graph per input.

    Subclasses build the graph of one input (`_graph`); `load` gives them their tensors.
    Call close() to release the weights.
    """

    def __init__(self, path: str, backend, buffers: dict):
        self.path = path
        self.backend = backend
        self._buffers = buffers
        self.n_embd_out = 0               # set by the subclass: the projector's output width

    @classmethod
    def load(cls, gguf: GGUFFile, backend, device, names, make):
        """Load the tensors `names` of an open file onto `device` (default: the backend's first)
        and return make(tensors, buffers); the buffers are freed if loading or make fails."""
        path = gguf.path
        device = device if device is not None else backend.devices[0]
        try:
            buffers = backend.load_weights(gguf, {n: device for n in names})
        except ggml.GGMLError as e:
            raise ModelError(f"{path}: {e}" if path not in str(e) else str(e)) from None
        tensors = {}
        for b in buffers.values():
            tensors.update(b.tensors)
        try:
            return make(tensors, buffers)
        except Exception:
            for b in buffers.values():
                b.close()
            raise

    def close(self) -> None:
        for b in self._buffers.values():
            b.close()
        self._buffers = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._buffers.values())

    def _graph(self, g, item) -> tuple:
        """Add one input's graph to g -> (output f32 [n_embd_out, n_tokens], {input tensor: array})."""
        raise NotImplementedError

    def encode(self, item) -> np.ndarray:
        """One input -> float32 [n_tokens, n_embd_out] embeddings."""
        return self._run(item, lambda out: out.read().reshape(-1, self.n_embd_out))

    def encode_on(self, item, device) -> ggml.Buffer:
        """Encode one input into a buffer on `device` holding tensor "embd" (f32
        [n_embd_out, n_tokens]), copied from the compute buffer device to device:
        embeddings kept where the text model runs never pass through host memory."""
        def keep(out):
            n_tokens = out.nbytes // 4 // self.n_embd_out
            buf = self.backend.alloc(device, [("embd", ggml.F32, (self.n_embd_out, n_tokens))])
            buf["embd"].copy_from(out)
            return buf
        return self._run(item, keep)

    def _run(self, item, take):
        g = self.backend.graph()
        try:
            out, inputs = self._graph(g, item)
            self.backend.compute(g, inputs)
            return take(out)
        finally:
            g.close()
