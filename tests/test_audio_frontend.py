"""Audio decoding and the whisper log-mel, bit for bit as llama.cpp 11434: the decoded
samples' sha256 of the synth-audio golden (its tools/ma_decode.c, llama.cpp's miniaudio),
and the log-mel's sha256 from llama.cpp's own mtmd-audio.cpp (tests/data/audio/README.md)."""
import hashlib
import json
import pathlib

import numpy as np
import pytest

from ggserve.models.audio.decode import AudioError, decode, exact_build, resampled_length, sniff
from ggserve.models.audio.mel import gemma4_chunk_frames, gemma4_chunks, log_mel, whisper_chunk_frames, whisper_chunks

AUDIO = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden" / "synth-audio" / "audio"
DECODED = json.loads((AUDIO / "decoded_pcm.json").read_text())["clips"]
MEL = json.loads((pathlib.Path(__file__).parent / "data" / "audio" / "whisper_mel.json").read_text())["clips"]


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, np.float32).tobytes()).hexdigest()


def test_installed_miniaudio_is_built_without_fast_math():
    assert exact_build(), "reinstall miniaudio as scripts/install.sh does (-fno-fast-math)"


@pytest.mark.parametrize("clip", sorted(DECODED))
def test_decoded_samples_equal_llama_cpp(clip):
    want = DECODED[clip]["decoded_16k_mono"]
    got = decode((AUDIO / clip).read_bytes())
    assert got.size == want["n_samples"]
    assert _sha(got) == want["sha256_f32le"]


def test_decoder_keeps_the_length_miniaudio_reports():
    # 48 kHz -> 16 kHz: miniaudio reports one frame more than it delivers; llama.cpp keeps it as 0.0
    assert resampled_length(16000, 48000, 288000) == 96001
    assert resampled_length(16000, 44100, 132300) == 48000
    got = decode((AUDIO / "dtmf_noise_48k_stereo_6s.wav").read_bytes())
    assert got[-1] == 0.0 and got[-2] != 0.0


@pytest.mark.parametrize("clip", sorted(MEL))
def test_whisper_log_mel_equals_llama_cpp(clip):
    mel = log_mel(decode((AUDIO / clip).read_bytes()), n_mel=128, n_fft=400, hop=160, sample_rate=16000)
    assert mel.shape == (MEL[clip]["n_mel"], MEL[clip]["n_frames"])
    assert _sha(mel) == MEL[clip]["sha256_f32le"]


@pytest.mark.parametrize("clip, n_chunks", [("tone_16k_mono_1s.wav", 1), ("steps_16k_mono_30s.wav", 2),
                                            ("long_16k_mono_35s.wav", 2)])
def test_whisper_chunks_cut_3000_frames_dropping_the_tail(clip, n_chunks):
    chunks = whisper_chunks(decode((AUDIO / clip).read_bytes()))
    assert [c.shape for c in chunks] == [(128, 3000)] * n_chunks


@pytest.mark.parametrize("n", [1, 160, 161, 400, 16000, 480000, 480001, 480161, 976007])
def test_chunk_frames_counted_from_the_length_equal_the_chunks_cut(n):
    # a prompt lays out a clip's chunks from these counts; its log-mel comes when the first is encoded
    samples = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    assert [c.shape[1] for c in whisper_chunks(samples)] == whisper_chunk_frames(n)
    assert [c.shape[1] for c in gemma4_chunks(samples)] == gemma4_chunk_frames(n)


def test_containers_found_by_magic_bytes_as_mtmd():
    assert sniff(b"RIFF\0\0\0\0WAVEfmt ") == "wav"
    assert sniff(b"ID3\x04" + bytes(8)) == "mp3"
    assert sniff(b"\xff\xfb\x90\x00" + bytes(8)) == "mp3"
    assert sniff(b"fLaC" + bytes(8)) == "flac"
    assert sniff(b"OggS" + bytes(8)) is None
    assert sniff(b"RIFF") is None


def test_not_audio_is_an_audio_error():
    with pytest.raises(AudioError, match="not a WAV, MP3 or FLAC"):
        decode(b"\x89PNG\r\n\x1a\n" + bytes(64))
    with pytest.raises(AudioError):
        decode(b"RIFF\x24\0\0\0WAVEfmt " + bytes(20))
