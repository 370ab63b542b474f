"""Repacked Q4_K weights times a decode step's rows by ggserve's kernel
(native/kernels/q4k_gemv.c) give ggml's floats bit for bit.

The weights are Gemma 3's own Q4_K matrices, repacked by ggml's CPU backend into
its eight-row interleaved layout as llama.cpp loads them; the reference is ggml's
mul_mat on the same tensor with ggserve's kernels off: ggml's gemv, the kernel
llama.cpp runs for each of fewer than four rows.
"""
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile

GGML_TYPE_Q4_K = 12
MATRICES = ["blk.2.ffn_down.weight", "blk.0.attn_output.weight"]     # k 2048 and 1024, 640 rows

pytestmark = pytest.mark.skipif(not ggml.q4_k_gemv_supported(), reason="the kernel needs AVX512-VNNI")


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda t: f"{t}threads")
def repacked(request, gemma3_path):
    """(backend with that many threads, Gemma 3's Q4_K matrices in the CPU backend's repack buffer)."""
    f = GGUFFile(gemma3_path)
    b = ggml.Backend(n_threads=request.param, use_gpu=False)
    buffers = b.load_weights(f, {}, repack={n for n, t in f.tensors.items() if t.ggml_type == GGML_TYPE_Q4_K})
    yield b, buffers["CPU_REPACK"]
    b.close()


def _product(backend, w, x, own):
    """mul_mat(w, x) for x [n, k] float32, and the ops the graph ran."""
    backend.cpu_kernels = own
    try:
        g = backend.graph()
    finally:
        backend.cpu_kernels = True
    inp = g.input("x", ggml.F32, (x.shape[1], x.shape[0]))
    y = g.output(g.mul_mat(w, inp))
    backend.compute(g, {inp: x})
    result, ops = y.read().reshape(x.shape[0], -1), [op for op, _, _ in g.ops()]
    g.close()
    return result, ops


@pytest.mark.parametrize("name", MATRICES)
@pytest.mark.parametrize("n_rows", [1, 2, 3])
def test_repacked_q4_k_product_of_a_few_rows_equals_ggml_bit_for_bit(repacked, name, n_rows):
    backend, buffer = repacked
    w = buffer.tensors[name]
    x = np.random.default_rng(n_rows).standard_normal((n_rows, w.ne[0]), dtype=np.float32)
    ours, ops = _product(backend, w, x, own=True)
    theirs, ggml_ops = _product(backend, w, x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_four_rows_stay_with_ggmls_gemm(repacked):
    """From four rows ggml computes groups of four by its gemm, which rounds otherwise."""
    backend, buffer = repacked
    w = buffer.tensors[MATRICES[0]]
    _, ops = _product(backend, w, np.ones((4, w.ne[0]), np.float32), own=True)
    assert ops == ["MUL_MAT"]
