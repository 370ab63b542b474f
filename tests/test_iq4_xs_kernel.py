"""ggserve's kernel for IQ4_XS weights times a decode step's few rows
(native/kernels/iq4xs_dot.c) gives ggml's floats bit for bit.

The weights are random IQ4_XS blocks (every nibble, 6-bit scale and sign the format
has; a block scale of a real matrix's size) in a GGUF of their own, loaded as llama.cpp
loads weights (IQ4_XS is not repacked on x86); the reference is ggml's mul_mat on the
same tensor with ggserve's kernels off: ggml_vec_dot_iq4_xs_q8_K for each of fewer
than eight rows, as llama.cpp computes them.
"""
import gguf
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile

K, M = 2048, 640                      # a 1B model's n_embd; rows split unevenly over 3 threads
BLOCK_BYTES = 136                     # d (f16), scales_h, scales_l[4], qs[128] per 256 values

pytestmark = pytest.mark.skipif(not ggml.iq4_xs_dot_supported(), reason="the kernel needs AVX512-VNNI")


@pytest.fixture(scope="module")
def iq4_xs_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(M, K // 256, BLOCK_BYTES), dtype=np.uint8)
    d = rng.uniform(0.0005, 0.002, size=(M, K // 256)).astype(np.float16)
    d[:, ::5] *= -1                                                       # a negative block scale too
    blocks[:, :, 0:2] = d.view(np.uint8).reshape(M, K // 256, 2)
    path = str(tmp_path_factory.mktemp("iq4_xs") / "iq4_xs.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("w.weight", blocks.reshape(M, -1), raw_dtype=gguf.GGMLQuantizationType.IQ4_XS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda t: f"{t}threads")
def iq4_xs_matrix(request, iq4_xs_file):
    """(backend with that many threads, the IQ4_XS matrix [K, M])."""
    b = ggml.Backend(n_threads=request.param, use_gpu=False)
    buffers = b.load_weights(GGUFFile(iq4_xs_file), {})
    yield b, buffers["CPU"].tensors["w.weight"]
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


def _x(n_rows):
    return np.random.default_rng(n_rows).standard_normal((n_rows, K), dtype=np.float32)


@pytest.mark.parametrize("n_rows", [1, 2, 3, 7])
def test_iq4_xs_product_of_a_few_rows_equals_ggml_bit_for_bit(iq4_xs_matrix, n_rows):
    backend, w = iq4_xs_matrix
    x = _x(n_rows)
    ours, ops = _product(backend, w, x, own=True)
    theirs, ggml_ops = _product(backend, w, x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_eight_rows_stay_with_ggmls_tiled_kernel(iq4_xs_matrix):
    backend, w = iq4_xs_matrix
    _, ops = _product(backend, w, _x(8), own=True)
    assert ops == ["MUL_MAT"]
