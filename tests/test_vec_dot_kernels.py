"""ggserve's kernels for Q5_K, Q6_K and IQ4_XS weights times a decode step's few rows
(native/kernels/q5k_dot.c, q6k_dot.c, iq4xs_dot.c) give ggml's floats bit for bit, in
products (mul_mat) and in a MoE layer's expert products (mul_mat_id).

Q6_K's weights are Gemma 3's own Q6_K matrix; Q5_K's and IQ4_XS's are random blocks
(every nibble, high bit, 6-bit scale and min the format has; block scales of a real
matrix's size, some negative) in a GGUF of their own. All are loaded as llama.cpp loads
weights (none of the three is repacked on x86). The reference is ggml's mul_mat on the
same tensor with ggserve's kernels off: its vec_dot for each of fewer than eight rows,
as llama.cpp computes them.
"""
import gguf
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile

K, M = 2048, 640                      # a 1B model's n_embd; rows split unevenly over 3 threads
GEMMA3_Q6_K = "blk.0.ffn_down.weight"  # Q6_K, k 2048, 640 rows
# random blocks: per 256 values their bytes, and where their f16 block scales lie (d; Q5_K: d, dmin)
RANDOM = {"IQ4_XS": (gguf.GGMLQuantizationType.IQ4_XS, 136, (0,)), "Q5_K": (gguf.GGMLQuantizationType.Q5_K, 176, (0, 2)),
          "Q6_K": (gguf.GGMLQuantizationType.Q6_K, 210, (208,))}
N_EXPERT, EXPERT_ROWS, N_USED = 8, 96, 4
SUPPORTED = {"IQ4_XS": ggml.iq4_xs_dot_supported(), "Q5_K": ggml.q5_k_dot_supported(),
             "Q6_K": ggml.q6_k_dot_supported()}


def _random_weights(path: str, qtype, block_bytes: int, scale_at, outer=(M,)) -> None:
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(*outer, K // 256, block_bytes), dtype=np.uint8)
    for at in scale_at:
        scales = rng.uniform(0.0005, 0.002, size=(*outer, K // 256)).astype(np.float16)
        scales[..., ::5] *= -1                                             # negative block scales too
        blocks[..., at:at + 2] = scales.view(np.uint8).reshape(*outer, K // 256, 2)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("w.weight", blocks.reshape(*outer, -1), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=["IQ4_XS", "Q5_K", "Q6_K"])
def weights(request, tmp_path_factory, gemma3_path):
    """(GGUF path, tensor name) of a matrix of that type."""
    if not SUPPORTED[request.param]:
        pytest.skip("the kernel needs AVX512-VNNI")
    if request.param == "Q6_K":
        return gemma3_path, GEMMA3_Q6_K
    path = str(tmp_path_factory.mktemp(request.param) / "w.gguf")
    _random_weights(path, *RANDOM[request.param])
    return path, "w.weight"


@pytest.fixture(scope="module", params=["IQ4_XS", "Q5_K", "Q6_K"])
def experts(request, tmp_path_factory):
    """(backend with 3 threads, a stack of N_EXPERT random experts [K, EXPERT_ROWS, N_EXPERT])."""
    if not SUPPORTED[request.param]:
        pytest.skip("the kernel needs AVX512-VNNI")
    path = str(tmp_path_factory.mktemp(request.param) / "experts.gguf")
    _random_weights(path, *RANDOM[request.param], outer=(N_EXPERT, EXPERT_ROWS))
    b = ggml.Backend(n_threads=3, use_gpu=False)
    buffers = b.load_weights(GGUFFile(path), {})
    yield b, buffers["CPU"].tensors["w.weight"]
    b.close()


@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda t: f"{t}threads")
def matrix(request, weights):
    """(backend with that many threads, the matrix [K, M])."""
    path, name = weights
    b = ggml.Backend(n_threads=request.param, use_gpu=False)
    buffers = b.load_weights(GGUFFile(path), {})
    yield b, buffers["CPU"].tensors[name]
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
def test_a_product_of_a_few_rows_equals_ggml_bit_for_bit(matrix, n_rows):
    backend, w = matrix
    x = _x(n_rows)
    ours, ops = _product(backend, w, x, own=True)
    theirs, ggml_ops = _product(backend, w, x, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT"]
    assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_eight_rows_stay_with_ggmls_tiled_kernel(matrix):
    backend, w = matrix
    _, ops = _product(backend, w, _x(8), own=True)
    assert ops == ["MUL_MAT"]


def _expert_product(backend, w, x, ids, own):
    """mul_mat_id(w, x, ids) for x [tokens, n_x, k] float32, ids [tokens, n_used], and the ops."""
    backend.cpu_kernels = own
    try:
        g = backend.graph()
    finally:
        backend.cpu_kernels = True
    inp = g.input("x", ggml.F32, (x.shape[2], x.shape[1], x.shape[0]))
    chosen = g.input("ids", ggml.I32, (ids.shape[1], ids.shape[0]))
    y = g.output(g.mul_mat_id(w, inp, chosen))
    backend.compute(g, {inp: x, chosen: ids})
    result, ops = y.read().reshape(x.shape[0], ids.shape[1], -1), [op for op, _, _ in g.ops()]
    g.close()
    return result, ops


def _routing(n_tokens):
    """Each token's N_USED distinct experts, as a top-k router picks them."""
    rng = np.random.default_rng(n_tokens)
    return np.stack([rng.permutation(N_EXPERT)[:N_USED] for _ in range(n_tokens)]).astype(np.int32)


@pytest.mark.parametrize("n_tokens", [1, 3, 7])
@pytest.mark.parametrize("n_x", [1, N_USED], ids=["gate-up", "down"])   # x shared by the chosen experts, or one each
def test_expert_products_of_a_few_tokens_equal_ggml_bit_for_bit(experts, n_tokens, n_x):
    backend, w = experts
    x = np.random.default_rng(n_x).standard_normal((n_tokens, n_x, K), dtype=np.float32)
    ids = _routing(n_tokens)
    ours, ops = _expert_product(backend, w, x, ids, own=True)
    theirs, ggml_ops = _expert_product(backend, w, x, ids, own=False)
    assert ops == ["CUSTOM"] and ggml_ops == ["MUL_MAT_ID"]
    assert np.isfinite(theirs).all() and np.abs(theirs).max() > 0
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_expert_products_of_eight_tokens_stay_with_ggml(experts):
    backend, w = experts
    x = np.zeros((8, 1, K), dtype=np.float32)
    _, ops = _expert_product(backend, w, x, _routing(8), own=True)
    assert ops == ["MUL_MAT_ID"]
