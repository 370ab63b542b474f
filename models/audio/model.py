"""An mmproj's audio encoder + projector: a clip -> chunks -> [n_tokens, n_embd_out] rows each.

The interface is the vision model's (both are models/mmproj.py MmprojEncoders), so the
engine encodes an audio chunk as it encodes an image tile: `encode_on(chunk, device)` on
the encoder's worker thread, embeddings kept in the image store by content key. Families:
models/audio/whisper.py (ultravox, voxtral, qwen2a), models/audio/gemma4a.py.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from ggserve.models.audio.config import read_config
from ggserve.models.mmproj import MmprojEncoder, open_gguf
from ggserve.models.registry import ModelError
from ggserve.models.weights import Weights


class ClipMel:
    """A clip's log-mel chunks, computed when the first of them is encoded: on the encoder's
    worker thread, one CPU thread beside the text steps (server/engine/images/encoder.py), not
    on the thread that builds prompts for every request; a clip whose embeddings are cached
    is never computed. Whisper normalises over the whole clip, so all chunks come at once."""

    def __init__(self, samples: np.ndarray, compute, frames: list[int]):
        self._samples, self._compute, self.frames = samples, compute, frames
        self._mels = None
        self._lock = threading.Lock()

    @property
    def computed(self) -> bool:
        return self._mels is not None

    def chunk(self, i: int) -> np.ndarray:
        with self._lock:
            if self._mels is None:
                mels = self._compute(self._samples)
                if [m.shape[1] for m in mels] != self.frames:
                    raise RuntimeError(f"the front end cut {[m.shape[1] for m in mels]} frames, "
                                       f"the prompt counted {self.frames}")
                self._mels, self._samples = mels, None
            return self._mels[i]


@dataclass
class AudioChunk:
    """One encoder input: chunk `index` of a clip's log-mel, float32 [n_mel, n_frames]."""

    clip: ClipMel
    index: int

    @property
    def mel(self) -> np.ndarray:
        return self.clip.chunk(self.index)

    @property
    def n_frames(self) -> int:
        return self.clip.frames[self.index]


class AudioChunks(list):
    """A clip's chunks in order, with each chunk's embedding rows and the wrapper text
    around them: `layout(text, place)` puts them into a prompt (models/vision/arrange.py)."""

    def __init__(self, chunks, n_tokens, wrappers):
        super().__init__(chunks)
        self.n_tokens = list(n_tokens)
        self.wrappers = wrappers

    def layout(self, text, place) -> None:
        begin, end = self.wrappers
        if begin:
            text(begin)
        for i in range(len(self)):
            place(i)
        if end:
            text(end)


def _families() -> dict:
    from ggserve.models.audio import gemma4a, whisper
    fams = {p: whisper.WhisperEncoder for p in whisper.FAMILIES}
    fams.update({p: gemma4a.Gemma4AudioEncoder for p in gemma4a.FAMILIES})
    return fams


def supported() -> tuple[str, ...]:
    return tuple(sorted(_families()))


class AudioModel(MmprojEncoder):
    def __init__(self, cfg, tensors: dict, path: str, backend, buffers: dict):
        super().__init__(path, backend, buffers)
        self.config = cfg
        self.projector = cfg.projector
        try:
            self.encoder = _families()[cfg.projector](cfg, Weights(tensors, path))
        except ValueError as e:
            raise ModelError(f"{path}: {e}") from None
        self.n_embd_out = self.encoder.n_embd_out
        if cfg.n_embd_out and cfg.n_embd_out != self.n_embd_out:
            raise ModelError(f"{path}: clip.audio.projection_dim is {cfg.n_embd_out}, the projector gives "
                             f"{self.n_embd_out}")
        # the front end's tables (mel filters, window, FFT twiddles) are made in Python loops that
        # hold the GIL: at load, not on the encoder's thread beside the first request's text steps
        self.encoder.mel_chunks(np.full(cfg.sample_rate // 10, 0.1, np.float32))

    @classmethod
    def from_gguf(cls, path, backend, device=None) -> AudioModel:
        """Load an mmproj's audio encoder onto `device` (default: the backend's first).
        ModelError naming the file for anything missing, unsupported or corrupt."""
        path = os.fspath(path)
        gguf = open_gguf(path)
        cfg = read_config(gguf.metadata, path, supported())
        names = [n for n in gguf.tensors if n.startswith(("a.", "mm.a.")) or n in ("v.boi", "v.eoi")]   # glma
        return cls.load(gguf, backend, device, names,
                        lambda tensors, buffers: cls(cfg, tensors, path, backend, buffers))

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    # -- preprocessing ---------------------------------------------------------------

    def preprocess(self, samples: np.ndarray) -> AudioChunks:
        """Mono float32 samples at sample_rate -> the clip's chunks (as mtmd cuts them); their
        log-mel is computed when the first is encoded (ClipMel)."""
        frames = self.encoder.chunk_frames(samples.size)
        clip = ClipMel(samples, self.encoder.mel_chunks, frames)
        return AudioChunks([AudioChunk(clip, i) for i in range(len(frames))],
                           [self.encoder.n_tokens(n) for n in frames], self.encoder.wrappers())

    # -- graphs ----------------------------------------------------------------------

    def max_graph(self):
        """The largest chunk's graph (3000 mel frames), for backend.reserve; the caller closes it."""
        g = self.backend.graph()
        g.output(self.encoder.build(g)[1])
        return g

    def reserve(self) -> None:
        """Reserve compute memory for the largest chunk's graph."""
        g = self.max_graph()
        try:
            self.backend.reserve(g)
        finally:
            g.close()

    def _graph(self, g, chunk: AudioChunk):
        mel = np.ascontiguousarray(chunk.mel, dtype=np.float32)
        inp, out, extra = self.encoder.build(g, mel.shape[1])
        out.set_name("audio_out")
        g.output(out)
        return out, {inp: mel, **extra}
