"""ggserve's tiled Q4_1 kernel (native/kernels/q4_1_matmul.c) gives ggml's floats bit for bit.

The weights are SmolLM2's own Q4_1 matrices; the reference is ggml's mul_mat on
the same backend with the tiled kernel switched off, which is llama.cpp's kernel.
"""
import gguf
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.server.default_model import default_model


@pytest.fixture(scope="module")
def smollm2_weights():
    """{name: (raw Q4_1 bytes, (k, m))} for two of SmolLM2's matrices."""
    reader = gguf.GGUFReader(default_model())
    out = {}
    for t in reader.tensors:
        if t.name in ("blk.0.ffn_up.weight", "blk.3.attn_k.weight"):
            assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
            out[t.name] = (np.array(t.data).tobytes(), tuple(int(n) for n in t.shape))
    return out


@pytest.fixture(scope="module")
def backend():
    b = ggml.Backend(n_threads=2, use_gpu=False)
    if not b.tiled_q4_1:
        pytest.skip("ggml's Q4_1 kernel here is not the AVX2 + FMA one the tiled kernel reproduces")
    yield b
    b.close()


def _product(backend, raw, k, m, x, tiled):
    """mul_mat(w, x) for x [n, k] float32, and the ops the graph ran."""
    weights = backend.alloc(backend.cpu, [("w", ggml.Q4_1, (k, m))])
    weights["w"].write(np.frombuffer(raw, dtype=np.uint8))
    backend.tiled_q4_1 = tiled
    try:
        g = backend.graph()
    finally:
        backend.tiled_q4_1 = True
    inp = g.input("x", ggml.F32, (k, x.shape[0]))
    y = g.output(g.mul_mat(weights["w"], inp))
    backend.compute(g, {inp: x})
    result, ops = y.read().reshape(x.shape[0], m), [op for op, _, _ in g.ops()]
    g.close()
    return result, ops


@pytest.fixture(params=["avx512vnni", "avx2"])
def isa(request):
    """Each copy of the kernel: the integer dot products differ in instructions only."""
    if ggml.q4_1_kernel_isa(request.param == "avx512vnni") != request.param:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    ggml.q4_1_kernel_isa(True)


# (matrix, its first m rows): 190 leaves two rows past the last whole tile of four
@pytest.mark.parametrize("name, m", [("blk.0.ffn_up.weight", 1536), ("blk.3.attn_k.weight", 190)])
@pytest.mark.parametrize("n_rows", [1, 2, 3, 9, 49, 130])
def test_tiled_q4_1_product_equals_ggml_bit_for_bit(backend, smollm2_weights, isa, name, m, n_rows):
    raw, (k, _) = smollm2_weights[name]
    raw = raw[:m * (k // 32) * 20]     # a Q4_1 block: 32 weights in 20 bytes
    x = np.random.default_rng(n_rows).standard_normal((n_rows, k), dtype=np.float32)
    ours, ops = _product(backend, raw, k, m, x, tiled=True)
    theirs, ggml_ops = _product(backend, raw, k, m, x, tiled=False)
    # a decode step's few rows are quantized inside the op, more by a node of their own
    assert ops == (["CUSTOM"] if n_rows <= ggml.Q4_1_INLINE_QUANT_ROWS else ["CPY", "CUSTOM"])
    assert ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))
