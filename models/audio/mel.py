"""Log-mel spectrograms as llama.cpp's mtmd computes them, bit for bit.

ref: llama.cpp tools/mtmd/mtmd-audio.cpp (fill_sin_cos_table, fill_hann_window,
fill_mel_filterbank_matrix, fft, log_mel_spectrogram, the whisper preprocessor).

Whisper front end: 16 kHz samples, a 200-sample reflect pad before and 30 s of zeros
(+200) after; frames of 400 samples every 160 (periodic Hann 400), power spectrum by
mtmd's own radix-2 FFT (a plain DFT on the odd 25-point leaves), 128 Slaney mel bins with
area norm, log10 of max(x, 2^-24), clamped at the whole clip's max - 8, (x + 4) / 4; cut
into 3000-frame chunks, the incomplete tail dropped.

Every float operation is done in the order and precision the C++ does it (float32
products and sums in the FFT and the 4-term blocks of the mel dot product, a double
accumulator across blocks, libm's sinf/cosf/log10), so the mel equals llama.cpp's.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

WHISPER_CHUNK_FRAMES = 3000
MEL_FLOOR = float(np.float32(5.960464477539063e-08))


def _libm():
    lib = ctypes.CDLL(ctypes.util.find_library("m"))
    for name in ("sinf", "cosf", "expf", "logf"):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lib


_LIBM = _libm()


@functools.cache
def sin_cos_table(n: int) -> tuple[np.ndarray, np.ndarray]:
    """sinf / cosf of 2*pi*i/n (the angle computed in double, rounded to float)."""
    theta = [(2 * math.pi * i) / n for i in range(n)]
    return (np.array([_LIBM.sinf(t) for t in theta], np.float32),
            np.array([_LIBM.cosf(t) for t in theta], np.float32))


@functools.cache
def hann_window(length: int, periodic: bool = True) -> np.ndarray:
    d = length + (0 if periodic else -1)
    return np.array([0.5 * (1.0 - _LIBM.cosf((2.0 * math.pi * i) / d)) for i in range(length)], np.float32)


@functools.cache
def mel_filters(n_mel: int, n_fft: int, sample_rate: int, fmin: float = 0.0, fmax: float = -1.0,
                slaney_area_norm: bool = True, use_htk: bool = False) -> np.ndarray:
    """float32 [n_mel, n_fft // 2 + 1] triangular filters (computed in double, as mtmd)."""
    if fmax <= 0.0:
        fmax = float(np.float32(0.5) * np.float32(sample_rate))
    if use_htk:
        def hz_to_mel(f):
            return 2595.0 * math.log10(1.0 + f / 700.0)

        def mel_to_hz(m):
            return 700.0 * (math.pow(10.0, m / 2595.0) - 1.0)
    else:       # Slaney (librosa's default)
        min_log_hz, lin_slope = 1000.0, 3 / 200.
        min_log_mel, log_step = min_log_hz * lin_slope, math.log(6.4) / 27.0

        def hz_to_mel(f):
            return f * lin_slope if f < min_log_hz else min_log_mel + math.log(f / min_log_hz) / log_step

        def mel_to_hz(m):
            return m / lin_slope if m < min_log_mel else min_log_hz * math.exp((m - min_log_mel) * log_step)
    bin_hz = float(sample_rate) / float(n_fft)
    m_lo, m_hi = hz_to_mel(fmin), hz_to_mel(fmax)
    hz = [mel_to_hz(m_lo + (m_hi - m_lo) * (float(i) / (n_mel + 1))) for i in range(n_mel + 2)]
    n_bins = n_fft // 2 + 1
    out = np.zeros((n_mel, n_bins), np.float32)
    for m in range(n_mel):
        left, center, right = hz[m], hz[m + 1], hz[m + 2]
        den_l, den_r = max(1e-30, center - left), max(1e-30, right - center)
        enorm = 2.0 / max(1e-30, right - left) if slaney_area_norm else 1.0
        for k in range(n_bins):
            f = k * bin_hz
            w = (f - left) / den_l if left <= f <= center else (right - f) / den_r if center < f <= right else 0.0
            out[m, k] = w * enorm
    return out


def fft_real(x: np.ndarray, sin: np.ndarray, cos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """mtmd's FFT of real rows x [F, N] (float32) -> (re, im) [F, N]: radix 2 down to an
    odd length, a direct DFT there; sin/cos: the tables of the top length."""
    n = x.shape[1]
    step = sin.size // n
    if n == 1:
        return x.copy(), np.zeros_like(x)
    if n % 2:
        re = np.zeros_like(x)
        im = np.zeros_like(x)
        k = np.arange(n)
        for j in range(n):
            idx = (k * j * step) % sin.size
            v = x[:, j:j + 1]
            re += v * cos[idx]
            im += -v * sin[idx]
        return re, im
    h = n // 2
    e_re, e_im = fft_real(np.ascontiguousarray(x[:, 0::2]), sin, cos)
    o_re, o_im = fft_real(np.ascontiguousarray(x[:, 1::2]), sin, cos)
    idx = np.arange(h) * step
    w_re, w_im = cos[idx], -sin[idx]
    a, b = w_re * o_re, w_im * o_im          # the twiddle products, each rounded to float
    c, d = w_re * o_im, w_im * o_re
    re = np.concatenate([(e_re + a) - b, (e_re - a) + b], axis=1)
    im = np.concatenate([(e_im + c) + d, (e_im - c) - d], axis=1)
    return re, im


def _mel_dot(power: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """sum_k power[f, k] * filters[m, k] -> float64 [F, n_mel], summed as mtmd does: float32
    blocks of four terms added to a double, then the remaining terms one by one. A block
    whose filter weights are all zero adds exactly 0 and is skipped."""
    n_frames, n_bins = power.shape
    total = np.zeros((n_frames, filters.shape[0]), np.float64)
    k = 0
    while k < n_bins - 3:
        rows = np.nonzero(filters[:, k:k + 4].any(axis=1))[0]
        if rows.size:
            w = filters[rows, k:k + 4]
            s = power[:, k:k + 1] * w[:, 0]
            for j in range(1, 4):
                s = s + power[:, k + j:k + j + 1] * w[:, j]
            total[:, rows] += s
        k += 4
    for tail in range(k, n_bins):
        total += power[:, tail:tail + 1] * filters[:, tail]
    return total


def log_mel(samples: np.ndarray, *, n_mel: int, n_fft: int, hop: int, sample_rate: int) -> np.ndarray:
    """Whisper's log-mel of float32 samples -> float32 [n_mel, n_frames] (see the module doc)."""
    x = np.asarray(samples, np.float32)
    if x.size < n_fft // 2 + 1:         # the reflect pad needs one sample plus half a window
        x = np.concatenate([x, np.zeros(n_fft // 2 + 1 - x.size, np.float32)])
    pad = n_fft // 2
    padded = np.zeros(x.size + sample_rate * 30 + 2 * pad, np.float32)
    padded[pad:pad + x.size] = x
    padded[:pad] = x[1:pad + 1][::-1]
    n_frames = (padded.size - n_fft) // hop + 1
    frames = np.lib.stride_tricks.as_strided(padded, (n_frames, n_fft), (hop * 4, 4))
    total = _mel_energies(frames, hann_window(n_fft), mel_filters(n_mel, n_fft, sample_rate), MEL_FLOOR, power=True)
    mel = _libm_rounded(np.log10, math.log10, total).reshape(n_frames, n_mel).T
    floor = float(mel.max()) - 8.0
    mel = mel.astype(np.float64)                      # compared and shifted in double, as the C++
    mel = np.where(mel < floor, float(np.float32(floor)), mel)
    return np.ascontiguousarray(((mel + 4.0) / 4.0).astype(np.float32))


def _mel_energies(frames: np.ndarray, window: np.ndarray, filters: np.ndarray, floor: float,
                  power: bool) -> np.ndarray:
    """float64 [F, n_mel]: max(the mel filters' sums of each frame's power (or magnitude)
    spectrum, floor). A frame of zeros (the 30 s of padding after a Whisper clip, silence)
    gives zeros in every bin, so `floor` without its FFT."""
    n_fft = frames.shape[1]
    live = np.flatnonzero(frames.any(axis=1))
    total = np.full((frames.shape[0], filters.shape[0]), floor, np.float64)
    if live.size:
        sin, cos = sin_cos_table(n_fft)
        re, im = fft_real(frames[live] * window, sin, cos)
        k = n_fft // 2 + 1
        spec = re[:, :k] * re[:, :k] + im[:, :k] * im[:, :k]
        total[live] = np.maximum(_mel_dot(spec if power else np.sqrt(spec), filters), floor)
    return total


def _libm_rounded(fast, exact, x: np.ndarray) -> np.ndarray:
    """float32(exact(x)) for float64 x, exact being libm's log10 or log (what the C++ calls).
    numpy's `fast` twin runs without the GIL (a Python loop over a clip's 400k values held it
    for tens of ms, stalling the engine's thread) but may differ from libm by a few ulps of the
    double: only where such ulps could move the float32 rounding is libm asked again."""
    y = fast(x.ravel())
    out = y.astype(np.float32)
    # y within 2^-40 (relative; thousands of double ulps) of a float32 rounding boundary,
    # or near 0 where a vector log's relative error is least sure
    unsure = np.flatnonzero(((y * (1 - 2.0 ** -40)).astype(np.float32) != (y * (1 + 2.0 ** -40)).astype(np.float32))
                            | (np.abs(y) < 1e-6))
    out[unsure] = np.array([exact(v) for v in x.ravel()[unsure]], np.float64).astype(np.float32)
    return out


def whisper_chunks(samples: np.ndarray, n_mel: int = 128) -> list[np.ndarray]:
    """The 3000-frame float32 [n_mel, 3000] chunks of mtmd's whisper preprocessor."""
    mel = log_mel(samples, n_mel=n_mel, n_fft=400, hop=160, sample_rate=16000)
    n = mel.shape[1] // WHISPER_CHUNK_FRAMES
    return [np.ascontiguousarray(mel[:, i * WHISPER_CHUNK_FRAMES:(i + 1) * WHISPER_CHUNK_FRAMES]) for i in range(n)]


def whisper_chunk_frames(n_samples: int) -> list[int]:
    """The frames of each chunk whisper_chunks cuts from n_samples, without computing them."""
    n_fft, hop = 400, 160
    padded = max(n_samples, n_fft // 2 + 1) + 16000 * 30 + n_fft
    return [WHISPER_CHUNK_FRAMES] * (((padded - n_fft) // hop + 1) // WHISPER_CHUNK_FRAMES)


@functools.cache
def gemma4_window(window: int, n_fft: int) -> np.ndarray:
    """A periodic Hann of `window` samples in float arithmetic, zeros after it up to n_fft."""
    out = np.zeros(n_fft, np.float32)
    two_pi = np.float32(2.0) * np.float32(math.pi)
    for i in range(window):
        c = np.float32(_LIBM.cosf(float(two_pi * np.float32(i) / np.float32(window))))
        out[i] = np.float32(0.5) - np.float32(0.5) * c
    return out


GEMMA4_FFT, GEMMA4_WINDOW, GEMMA4_HOP = 512, 320, 160


def gemma4_chunks(samples: np.ndarray, n_mel: int = 128, rate: int = 16000) -> list[np.ndarray]:
    """mtmd's gemma4a front end: 30 s pieces, each float32 [n_mel, n_frames] (see the module doc)."""
    n_fft, window, hop = GEMMA4_FFT, GEMMA4_WINDOW, GEMMA4_HOP
    x = np.asarray(samples, np.float32)
    filters = mel_filters(n_mel, n_fft, rate, 0.0, rate / 2.0, slaney_area_norm=False, use_htk=True)
    out = []
    for off in range(0, x.size, 30 * rate):
        piece = x[off:off + 30 * rate]
        pad_left = window // 2
        n_frames = (piece.size + pad_left - (window + 1)) // hop + 1
        total_pad = max((n_frames - 1) * hop + n_fft - piece.size, pad_left)
        padded = np.zeros(total_pad + piece.size, np.float32)
        padded[pad_left:pad_left + piece.size] = piece
        n_len = (padded.size - n_fft) // hop + 1
        frames = np.lib.stride_tricks.as_strided(padded, (n_len, n_fft), (hop * 4, 4))
        total = _mel_energies(frames, gemma4_window(window, n_fft), filters, float(np.float32(0.001)), power=False)
        mel = _libm_rounded(np.log, math.log, total).reshape(n_len, n_mel).T[:, :min(n_len, n_frames)]
        out.append(np.ascontiguousarray(mel))
    return out


def gemma4_chunk_frames(n_samples: int, rate: int = 16000) -> list[int]:
    """The frames of each piece gemma4_chunks cuts from n_samples, without computing them."""
    out = []
    for off in range(0, n_samples, 30 * rate):
        size = min(30 * rate, n_samples - off)
        n_frames = (size + GEMMA4_WINDOW // 2 - (GEMMA4_WINDOW + 1)) // GEMMA4_HOP + 1
        total_pad = max((n_frames - 1) * GEMMA4_HOP + GEMMA4_FFT - size, GEMMA4_WINDOW // 2)
        out.append(min((total_pad + size - GEMMA4_FFT) // GEMMA4_HOP + 1, n_frames))
    return out
