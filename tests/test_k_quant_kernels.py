"""ggserve's kernels for the K-quants of a decode step give ggml's floats bit for bit:
repacked Q4_K (native/kernels/q4k_gemv.c, as ggml's gemv) and Q6_K
(native/kernels/q6k_dot.c, as ggml's vec_dot).

The weights are Gemma 3's own Q4_K and Q6_K matrices, loaded as llama.cpp loads them
(Q4_K repacked by ggml's CPU backend into its eight-row interleaved layout, Q6_K
mapped); the reference is ggml's mul_mat on the same tensor with ggserve's kernels
off: the kernel llama.cpp runs for that many rows.
"""
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile

GGML_TYPE_Q4_K, GGML_TYPE_Q6_K = 12, 14
Q4_K_MATRICES = ["blk.2.ffn_down.weight", "blk.0.attn_output.weight"]     # k 2048 and 1024, 640 rows
Q6_K_MATRICES = ["blk.0.ffn_down.weight"]                                  # k 2048, 640 rows


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda t: f"{t}threads")
def gemma3_weights(request, gemma3_path):
    """(backend with that many threads, {name: weight tensor}) for Gemma 3's K-quant matrices."""
    f = GGUFFile(gemma3_path)
    b = ggml.Backend(n_threads=request.param, use_gpu=False)
    buffers = b.load_weights(f, {}, repack={n for n, t in f.tensors.items() if t.ggml_type == GGML_TYPE_Q4_K})
    tensors = {**buffers["CPU"].tensors, **buffers["CPU_REPACK"].tensors}
    yield b, tensors
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


def _x(n_rows, k):
    return np.random.default_rng(n_rows).standard_normal((n_rows, k), dtype=np.float32)


@pytest.mark.skipif(not ggml.q4_k_gemv_supported(), reason="the kernel needs AVX512-VNNI")
@pytest.mark.parametrize("name", Q4_K_MATRICES)
@pytest.mark.parametrize("n_rows", [1, 2, 3])
def test_repacked_q4_k_product_of_a_few_rows_equals_ggml_bit_for_bit(gemma3_weights, name, n_rows):
    backend, weights = gemma3_weights
    x = _x(n_rows, weights[name].ne[0])
    ours, ops = _product(backend, weights[name], x, own=True)
    theirs, ggml_ops = _product(backend, weights[name], x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.skipif(not ggml.q4_k_gemv_supported(), reason="the kernel needs AVX512-VNNI")
def test_four_rows_of_repacked_q4_k_stay_with_ggmls_gemm(gemma3_weights):
    """From four rows ggml computes groups of four by its gemm, which rounds otherwise."""
    backend, weights = gemma3_weights
    w = weights[Q4_K_MATRICES[0]]
    _, ops = _product(backend, w, _x(4, w.ne[0]), own=True)
    assert ops == ["MUL_MAT"]


@pytest.mark.skipif(not ggml.q6_k_dot_supported(), reason="the kernel needs AVX512-VNNI")
@pytest.mark.parametrize("name", Q6_K_MATRICES)
@pytest.mark.parametrize("n_rows", [1, 2, 3, 7])
def test_q6_k_product_of_a_few_rows_equals_ggml_bit_for_bit(gemma3_weights, name, n_rows):
    backend, weights = gemma3_weights
    x = _x(n_rows, weights[name].ne[0])
    ours, ops = _product(backend, weights[name], x, own=True)
    theirs, ggml_ops = _product(backend, weights[name], x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


@pytest.mark.skipif(not ggml.q6_k_dot_supported(), reason="the kernel needs AVX512-VNNI")
def test_eight_rows_of_q6_k_stay_with_ggmls_tiled_kernel(gemma3_weights):
    backend, weights = gemma3_weights
    w = weights[Q6_K_MATRICES[0]]
    _, ops = _product(backend, w, _x(8, w.ne[0]), own=True)
    assert ops == ["MUL_MAT"]
