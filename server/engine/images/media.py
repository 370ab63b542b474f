"""An mmproj's encoders (vision, audio, or both as in Gemma 4's) as the engine sees them.

Both load onto one ggml backend of their own, so the image encoder's worker thread
(images/encoder.py) runs either kind of chunk, one at a time, beside text steps: an
image tile or an audio chunk (models/audio AudioChunk) goes to its encoder.
"""
from __future__ import annotations

from ggserve.models.audio.model import AudioChunk, AudioModel
from ggserve.models.registry import ModelError
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile


class MediaModels:
    def __init__(self, vision, audio, backend):
        self.vision, self.audio, self.backend = vision, audio, backend

    @classmethod
    def load(cls, mmproj: str, n_threads: int, n_embd_in: int, text_path: str) -> "MediaModels":
        """The encoders the file has, each checked against the text model's input width."""
        from ggserve.models.vision import VisionModel

        try:
            meta = GGUFFile(mmproj).metadata
        except Exception:   # noqa: BLE001 - the vision loader names what is wrong with the file
            meta = {"clip.has_vision_encoder": True}
        backend = ggml.Backend(n_threads=n_threads)
        vision = audio = None
        try:
            # a file without either encoder: the vision loader's error names it
            if meta.get("clip.has_vision_encoder", False) or not meta.get("clip.has_audio_encoder", False):
                vision = VisionModel.from_gguf(mmproj, backend)
            if meta.get("clip.has_audio_encoder", False):
                audio = AudioModel.from_gguf(mmproj, backend)
            for kind, m in (("image", vision), ("audio", audio)):
                if m is not None and m.n_embd_out != n_embd_in:
                    raise ModelError(f"{mmproj}: the {kind} projector projects to {m.n_embd_out} dims, "
                                     f"the text model {text_path} takes {n_embd_in}")
        except ModelError as e:
            for m in (vision, audio):
                if m is not None:
                    m.close()
            backend.close()
            # an mmproj that cannot pair with this text model: name both files
            raise ModelError(e.args[0] if text_path in e.args[0] else f"{e} (text model {text_path})") from None
        return cls(vision, audio, backend)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in (self.vision, self.audio) if m is not None)

    def encode_on(self, chunk, device) -> ggml.Buffer:
        model = self.audio if isinstance(chunk, AudioChunk) else self.vision
        return model.encode_on(chunk, device)

    def reserve(self) -> None:
        """Compute memory for the largest image tile and the largest audio chunk."""
        for m in (self.vision, self.audio):
            if m is not None:
                m.reserve()

    def close(self) -> None:
        for m in (self.vision, self.audio):
            if m is not None:
                m.close()
        self.backend.close()
