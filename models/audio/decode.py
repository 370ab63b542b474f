"""Audio file bytes -> the mono float32 samples llama.cpp's mtmd feeds its front end.

ref: llama.cpp tools/mtmd/mtmd-helper.cpp (is_audio_file, decode_audio_from_buf).
llama.cpp decodes with miniaudio 0.11.25 (vendored): WAV, MP3 or FLAC found by their magic
bytes, f32, one channel (the mean of the channels), resampled to the encoder's rate by
miniaudio's default linear resampler. It keeps `ma_decoder_get_length_in_pcm_frames`
samples, which for some rate ratios is one more than the decoder delivers: that last
sample stays 0.0.

We call the same miniaudio through the `miniaudio` package. Its wheels are compiled with
-ffast-math, which moves resampled samples by an ulp; scripts/install.sh builds it from
source with -fno-fast-math (`exact_build()` tells which one is installed).
"""
from __future__ import annotations

import hashlib

import numpy as np

FORMATS = ("wav", "mp3", "flac")


class AudioError(ValueError):
    """Bytes that are not an audio file llama.cpp decodes, or that fail to decode."""


def sniff(data: bytes) -> str | None:
    """The container by its magic bytes as mtmd-helper checks them ("wav", "mp3", "flac"), or None."""
    if len(data) < 12:
        return None
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:3] == b"ID3" or (data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[:4] == b"fLaC":
        return "flac"
    return None


def resampled_length(rate_out: int, rate_in: int, n_in: int) -> int:
    """ma_calculate_frame_count_after_resampling: the length miniaudio's decoder reports
    (ma_decoder_get_length_in_pcm_frames) for n_in frames at rate_in read at rate_out."""
    if rate_in == 0 or rate_out == 0 or n_in == 0:
        return 0
    if rate_out == rate_in:
        return n_in
    n_out = n_in * rate_out // rate_in
    whole = n_out * (rate_in % rate_out) + n_out * (rate_in // rate_out) // rate_out
    return n_out + 1 if whole <= n_in else n_out


def decode(data: bytes, rate: int = 16000) -> np.ndarray:
    """Audio file bytes -> float32 [n] mono samples at `rate`, as llama.cpp decodes them."""
    import miniaudio

    kind = sniff(data)
    if kind is None:
        raise AudioError("the data is not a WAV, MP3 or FLAC file")
    info_of = {"wav": miniaudio.wav_get_info, "mp3": miniaudio.mp3_get_info, "flac": miniaudio.flac_get_info}[kind]
    try:
        info = info_of(data)
        got = miniaudio.decode(data, miniaudio.SampleFormat.FLOAT32, 1, rate)
    except miniaudio.MiniaudioError as e:
        raise AudioError(f"could not decode the {kind.upper()} data: {e}") from None
    if info.sample_rate <= 0 or info.num_frames <= 0:
        raise AudioError(f"the {kind.upper()} data holds no samples")
    n = resampled_length(rate, info.sample_rate, info.num_frames)
    samples = np.frombuffer(got.samples, dtype=np.float32)
    out = np.zeros(n, dtype=np.float32)
    k = min(n, samples.size)
    out[:k] = samples[:k]
    return out


# a 44.1 kHz stereo clip whose resampled samples differ in the last bit under -ffast-math
_PROBE_SHA = "f7189458423bdc1177f2d2e2bcf580c00e361b449d73d2878779f94a83057d2f"


def exact_build() -> bool:
    """Whether the installed miniaudio resamples as llama.cpp's (built without -ffast-math)."""
    import miniaudio

    t = np.arange(4410) / 44100.0
    pcm = (np.stack([np.sin(2 * np.pi * 440 * t), np.sin(2 * np.pi * 660 * t)], axis=1) * 12000).astype(np.int16)
    wav = _wav_bytes(pcm, 44100)
    got = np.frombuffer(miniaudio.decode(wav, miniaudio.SampleFormat.FLOAT32, 1, 16000).samples, np.float32)
    return hashlib.sha256(got.tobytes()).hexdigest() == _PROBE_SHA


def _wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    import struct

    ch = pcm.shape[1]
    body = pcm.astype("<i2").tobytes()
    return (b"RIFF" + struct.pack("<I", 36 + len(body)) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, ch, rate,
            rate * ch * 2, ch * 2, 16) + b"data" + struct.pack("<I", len(body)) + body)


class Clip:
    """Decoded audio in a prompt's media list (beside images): mono float32 samples."""

    def __init__(self, samples: np.ndarray, rate: int):
        self.samples = samples
        self.rate = rate

    @property
    def seconds(self) -> float:
        return self.samples.size / self.rate
