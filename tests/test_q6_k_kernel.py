"""ggserve's kernel for Q6_K weights times a decode step's few rows
(native/kernels/q6k_dot.c) gives ggml's floats bit for bit.

The weights are Gemma 3's own Q6_K matrices (Q6_K is not repacked on x86: mapped
from the file, as llama.cpp loads them); the reference is ggml's mul_mat on the same
tensor with ggserve's kernels off: ggml_vec_dot_q6_K_q8_K for each of fewer than
eight rows, as llama.cpp computes them.
"""
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile

MATRIX = "blk.0.ffn_down.weight"       # Q6_K, k 2048, 640 rows

pytestmark = pytest.mark.skipif(not ggml.q6_k_dot_supported(), reason="the kernel needs AVX512-VNNI")


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda t: f"{t}threads")
def gemma3_q6_k(request, gemma3_path):
    """(backend with that many threads, one of Gemma 3's Q6_K matrices)."""
    b = ggml.Backend(n_threads=request.param, use_gpu=False)
    buffers = b.load_weights(GGUFFile(gemma3_path), {})
    yield b, buffers["CPU"].tensors[MATRIX]
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


@pytest.mark.parametrize("n_rows", [1, 2, 3, 7])
def test_q6_k_product_of_a_few_rows_equals_ggml_bit_for_bit(gemma3_q6_k, n_rows):
    backend, w = gemma3_q6_k
    x = _x(n_rows, w.ne[0])
    ours, ops = _product(backend, w, x, own=True)
    theirs, ggml_ops = _product(backend, w, x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_eight_rows_stay_with_ggmls_tiled_kernel(gemma3_q6_k):
    backend, w = gemma3_q6_k
    _, ops = _product(backend, w, _x(8, w.ne[0]), own=True)
    assert ops == ["MUL_MAT"]
