"""Dense architectures of issue 16 (qwen3, phi3, mistral3, gemma4) against llama.cpp
on the synthetic golden models (../shared/golden/synth: random weights, real
vocabularies): greedy continuations and top-5 logprobs of every golden prompt
(batching: tests/test_engine_synth_batching.py)."""
import pytest

from engine_helpers import generate, max_logprob_deviation, tokens
from synth_golden import completions, engine, steps

ARCHS = ("qwen3", "phi3", "mistral3", "gemma4")
ISSUE31_DENSE = ("olmo2", "smollm3", "seed_oss")      # issue 31 (golden README "Second batch")
ARCHS += ISSUE31_DENSE
ARCHS += ("exaone4",)                                # EXAONE 4: hybrid attention, its SWA layers in a ring
ARCHS += ("gemma4e",)                                # Gemma 4 E: per-layer embeddings, shared KV
ARCHS += ("cohere2",)                                # Command R7B: parallel blocks, SWA layers in a ring
NEAR_TIE = 0.02       # accepted divergence: llama.cpp's own top-2 gap below this
LOGPROB_TOL = 0.01
GOLDEN = completions()["models"]
CASES = [pytest.param(arch, c, id=f"{arch}-{c['key']}") for arch in ARCHS for c in GOLDEN[arch]]


@pytest.fixture(scope="module")
def engines():
    made = {}
    yield lambda arch: made.setdefault(arch, engine(arch))
    for e in made.values():
        e.close()


_RUNS = {}


def _run(engines, arch, case):
    key = (arch, case["key"])
    if key not in _RUNS:
        engine = engines(arch)
        engine.clear_cache()
        _RUNS[key] = generate(engine, {"r": case["prompt_ids"]}, len(case["generated_ids"]))["r"]
    return _RUNS[key]


def _gap(step):
    top = sorted((lp for _, lp in step["top_logprobs"]), reverse=True)
    return top[0] - top[1]


def test_every_dense_architecture_has_golden_prompts():
    assert {arch: len(GOLDEN[arch]) for arch in ARCHS} == {arch: 7 for arch in ARCHS}


@pytest.mark.parametrize("arch,case", CASES)
def test_greedy_tokens_equal_llama_cpp(engines, arch, case):
    ours = tokens(_run(engines, arch, case))
    gold = case["generated_ids"]
    i = next((i for i, (x, y) in enumerate(zip(ours, gold)) if x != y), None)
    if i is None:
        assert ours == gold
    else:
        step = steps(case)[i]
        assert step["probs_available"] and _gap(step) < NEAR_TIE, (
            f"diverged at step {i}: ours {ours[i]}, llama.cpp {gold[i]}, llama.cpp top-2 gap "
            f"{_gap(step) if step['probs_available'] else 'n/a'}")


@pytest.mark.parametrize("arch,case", CASES)
def test_top5_logprobs_within_tolerance(engines, arch, case):
    worst = max_logprob_deviation(_run(engines, arch, case), steps(case))
    print(f"max |logprob difference| {worst:.6f}")      # reported with pytest -s
    assert worst <= LOGPROB_TOL, f"max |logprob difference| {worst:.4f}"
