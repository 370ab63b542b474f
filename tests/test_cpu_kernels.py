"""ggserve's own CPU kernels (native/kernels/matmul.c) give ggml's floats bit for bit.

The weights are SmolLM2's own Q4_1 matrices and its Q8_0 token embeddings (its
LM head); the reference is ggml's mul_mat on the same backend with ggserve's
kernels switched off, which is llama.cpp's kernel.
"""
import gguf
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.server.default_model import default_model

BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}       # bytes of a block of 32 weights
MATRICES = {"blk.0.ffn_up.weight": "q4_1", "blk.3.attn_k.weight": "q4_1", "token_embd.weight": "q8_0"}


@pytest.fixture(scope="module")
def smollm2_weights():
    """{name: (raw bytes, k)} for three of SmolLM2's matrices."""
    out = {}
    for t in gguf.GGUFReader(default_model()).tensors:
        if t.name in MATRICES:
            assert t.tensor_type.name.lower() == MATRICES[t.name]
            out[t.name] = (np.array(t.data).tobytes(), int(t.shape[0]))
    return out


@pytest.fixture(scope="module")
def backend():
    b = ggml.Backend(n_threads=2, use_gpu=False)
    if not b.cpu_kernels:
        pytest.skip("ggml's kernels here are not the AVX2 + FMA ones ggserve's reproduce")
    yield b
    b.close()


@pytest.fixture(params=["avx512vnni", "avx2"])
def isa(request):
    """Each copy of the kernels: the integer dot products differ in instructions only."""
    if ggml.cpu_kernels_isa(request.param == "avx512vnni") != request.param:
        pytest.skip(f"this CPU has no {request.param}")
    yield request.param
    ggml.cpu_kernels_isa(True)


def _product(backend, weights, name, m, x, own):
    """mul_mat(the first m rows of a matrix, x) for x [n, k] float32, and the ops the graph ran."""
    raw, k = weights[name]
    kind = MATRICES[name]
    buf = backend.alloc(backend.cpu, [("w", ggml.type_by_name(kind), (k, m))])
    buf["w"].write(np.frombuffer(raw[:m * k // 32 * BLOCK_BYTES[kind]], dtype=np.uint8))
    backend.cpu_kernels = own
    try:
        g = backend.graph()
    finally:
        backend.cpu_kernels = True
    inp = g.input("x", ggml.F32, (k, x.shape[0]))
    y = g.output(g.mul_mat(buf["w"], inp))
    backend.compute(g, {inp: x})
    result, ops = y.read().reshape(x.shape[0], m), [op for op, _, _ in g.ops()]
    g.close()
    return result, ops


def _x(n_rows, k):
    return np.random.default_rng(n_rows).standard_normal((n_rows, k), dtype=np.float32)


# (matrix, its first m rows): 190 leaves two rows past the last whole group of four
@pytest.mark.parametrize("name, m", [("blk.0.ffn_up.weight", 1536), ("blk.3.attn_k.weight", 190)])
@pytest.mark.parametrize("n_rows", [1, 2, 3, 9, 16, 17, 49, 130])
def test_q4_1_product_equals_ggml_bit_for_bit(backend, smollm2_weights, isa, name, m, n_rows):
    x = _x(n_rows, smollm2_weights[name][1])
    ours, ops = _product(backend, smollm2_weights, name, m, x, own=True)
    theirs, ggml_ops = _product(backend, smollm2_weights, name, m, x, own=False)
    # a decode step's few rows are quantized inside the op, more by a node of their own
    assert ops == (["CUSTOM"] if n_rows <= ggml.CPU_KERNEL_FEW_ROWS else ["CPY", "CUSTOM"])
    assert ggml_ops == ["MUL_MAT"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


# the LM head whole, and 1026 rows: two past the last group of four; a decode step's
# rows (one stream, an odd number of streams or drafted tokens, the most the kernel takes)
@pytest.mark.parametrize("m", [49152, 1026])
@pytest.mark.parametrize("n_rows", [1, 2, 3, 9, 16])
def test_q8_0_product_of_a_few_rows_equals_ggml_bit_for_bit(backend, smollm2_weights, isa, m, n_rows):
    x = _x(n_rows, smollm2_weights["token_embd.weight"][1])
    ours, ops = _product(backend, smollm2_weights, "token_embd.weight", m, x, own=True)
    theirs, _ = _product(backend, smollm2_weights, "token_embd.weight", m, x, own=False)
    assert ops == ["CUSTOM"]
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_q8_0_products_of_more_rows_stay_with_ggmls_tiled_kernel(backend, smollm2_weights):
    n_rows = ggml.CPU_KERNEL_FEW_ROWS + 1
    _, ops = _product(backend, smollm2_weights, "token_embd.weight", 1024, _x(n_rows, 576), own=True)
    assert ops == ["MUL_MAT"]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name, m, n_rows", [("blk.3.attn_k.weight", 190, 1), ("blk.3.attn_k.weight", 190, 20),
                                             ("token_embd.weight", 1026, 3)])
def test_any_thread_count_gives_ggmls_bits(smollm2_weights, threads, name, m, n_rows):
    """Threads split the weight rows in groups of four; the last one may get a part."""
    b = ggml.Backend(n_threads=threads, use_gpu=False)
    try:
        x = _x(n_rows, smollm2_weights[name][1])
        ours, ops = _product(b, smollm2_weights, name, m, x, own=True)
        theirs, _ = _product(b, smollm2_weights, name, m, x, own=False)
    finally:
        b.close()
    assert "CUSTOM" in ops
    assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_an_engine_on_ggmls_kernels_answers_the_same_tokens_and_logprobs(smollm2_path):
    """Four prompts batched, greedy with top-10 logprobs: every float the same."""
    from engine_helpers import generate
    from ggserve.server.engine.engine import EngineConfig, Engine

    prompts = {f"p{i}": [1, 504 + i, 2300 + 7 * i, 30 + i] for i in range(4)}
    answers = []
    for own in (True, False):
        e = Engine(EngineConfig(smollm2_path, n_ctx=1024, n_parallel=4, n_threads=2, cpu_kernels=own))
        assert e.backend.cpu_kernels is own
        answers.append({rid: [(ev.token, ev.top_logprobs) for ev in evs]
                        for rid, evs in generate(e, prompts, 12).items()})
        e.close()
    assert answers[0] == answers[1]
