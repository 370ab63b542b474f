"""The kernel-parity switch: with it off the engine makes plain calls (one attention
call per step, no matmul row plans) and still answers as llama.cpp does, within
rounding."""
import json
import pathlib

import numpy as np

from ggserve.server.engine.engine import EngineConfig, Engine
from ggserve.server.engine.kernel_parity import FA_TILED_MIN_ROWS, KernelParity
from engine_helpers import generate, max_logprob_deviation, tokens

GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]["smollm2"]


def _views(seq):
    return {0: (0, 256), 1: (1024, 1280)}[seq]


def test_off_one_attention_call_covers_every_row_and_cell():
    parity = KernelParity(False, {"w": "repack"}, False)
    seq_ids = np.array([0, 0, 1])
    assert parity.attention_calls(seq_ids, None, _views) == [(0, 3, 0, 1280, 3)]
    assert parity.kinds == [] and parity.min_attention_rows == 1


def test_on_rows_of_a_long_ubatch_get_a_tiled_call_each_sequence():
    parity = KernelParity(True, {}, False)
    seq_ids = np.array([0] * 70 + [1])
    ubatches = (np.zeros(71, dtype=np.int64), np.array([70] * 70 + [1]))
    calls = parity.attention_calls(seq_ids, ubatches, _views)
    assert calls == [(0, 70, 0, 256, 70), (70, 71, 1024, 1280, 1)]
    assert parity.min_attention_rows == FA_TILED_MIN_ROWS


def test_off_the_engine_still_gives_llama_cpps_answers_batched(smollm2_path):
    cases = GOLDEN[:4]
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_batch=512, n_parallel=4, n_threads=2, kernel_parity=False))
    events = generate(e, {c["key"]: c["prompt_ids"] for c in cases}, 16)
    e.close()
    for c in cases:
        assert tokens(events[c["key"]]) == c["generated_ids"][:16]
        assert max_logprob_deviation(events[c["key"]], c["steps"][:16]) <= 0.01


def test_lone_rows_of_float_weights_get_the_one_row_kernel():
    """llamafile's tinyBLAS takes calls of >= 2 rows of F16/BF16/F32 weights and
    leaves a lone row to vec_dot, which rounds differently: decode rows (each a
    1-row ubatch in llama-server) batched together must still get vec_dot."""
    from ggserve.native import ggml
    from ggserve.server.engine.kernel_parity import RowPlan, batched_rows

    rng = np.random.default_rng(0)
    k, m, n = 128, 64, 4
    w_np = rng.standard_normal((m, k)).astype(np.float16)
    x_np = rng.standard_normal((n, k)).astype(np.float32)
    backend = ggml.Backend(n_threads=2, use_gpu=False)

    def product(build):
        g = backend.graph()
        w, x = g.input("w", ggml.F16, (k, m)), g.input("x", ggml.F32, (k, n))
        y = g.output(build(g, w, x))
        backend.compute(g, {w: w_np, x: x_np})
        out = y.read().copy()
        g.close()
        return out

    pos = np.arange(10, 10 + n)
    decode = batched_rows("sgemm", pos, pos, np.ones(n, dtype=np.int64))    # generated tokens
    plan = RowPlan("sgemm", decode, n)
    lone = product(lambda g, w, x: g.concat(
        g.concat(*[g.mul_mat(w, g.view(x, (k, 1), (x.nb[1],), i * x.nb[1])) for i in (0, 1)], 1),
        g.concat(*[g.mul_mat(w, g.view(x, (k, 1), (x.nb[1],), i * x.nb[1])) for i in (2, 3)], 1), 1))

    planned = product(lambda g, w, x: (plan.declare(g), plan.apply(g, w, x, True))[1])
    together = product(lambda g, w, x: g.mul_mat(w, x))
    backend.close()
    assert not decode.any()
    assert np.array_equal(planned, lone)
    assert not np.array_equal(together, lone)      # why the plan exists
