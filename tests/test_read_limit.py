"""bench/read_limit.py: the physical limit a decode step meets on a CPU, the memory's
read speed over the bytes of weights one token reads."""
import importlib.util
import os
import sys

from synth_golden import SYNTH

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load():
    spec = importlib.util.spec_from_file_location("ggserve_bench_read_limit", os.path.join(ROOT, "bench", "read_limit.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


read_limit = _load()


def test_a_token_reads_every_matrix_once_and_the_routed_share_of_each_expert_stack():
    # the synthetic Qwen3-MoE: n_embd 32, 4 layers, 8 experts of 64 with 2 used, Q8_0 (34 bytes
    # a 32-value block) except the tied Q4_0 embedding (18 bytes a block), which is the LM head
    lm_head = 151936 * 18                                   # read whole: the output matrix
    attention = (128 + 64 + 64) * 34 + 32 * 4 * 34          # q, k, v rows of 32; o rows of 128
    experts = 3 * (8 * 64 * 34) * 2 // 8                    # gate, up, down stacks: 2 of 8 experts
    assert read_limit.decode_bytes(str(SYNTH / "models" / "synth-qwen3moe-q8_0.gguf")) == \
        lm_head + 4 * (attention + experts)


def test_the_read_speed_is_measured_by_the_compiled_reader():
    gbs = read_limit.read_bandwidth(threads=1, mib=64, reps=2)
    assert 0.1 < gbs < 10_000
