"""Batching that does not change llama.cpp's answers, for every synthetic text
architecture of issues 16 and 31 (../shared/golden/synth): four prompts together, a prompt
fed in chunks, a reused prefix."""
import pytest

from engine_helpers import generate, max_logprob_deviation, tokens
from synth_golden import case, engine, steps

ARCHS = ("qwen3", "phi3", "mistral3", "gemma4", "qwen3moe", "gpt-oss", "llama4", "glm4moe", "deepseek2")
LOGPROB_TOL = 0.01
ARCHS += ("olmo2", "smollm3", "seed_oss")             # issue 31 dense
ARCHS += ("exaone4",)
ARCHS += ("gemma4e",)                                 # Gemma 4 E: per-layer embeddings, shared KV
ARCHS += ("cohere2",)                                 # Command R7B: parallel blocks, SWA layers in a ring
FOUR = ("capital", "story", "code_fib", "qa_math")


# llama.cpp ran each golden prompt alone, so "equal to each alone" is "equal to the golden"

@pytest.mark.parametrize("arch", ARCHS)
def test_four_prompts_in_one_batch_equal_each_alone(arch):
    e = engine(arch, n_parallel=4)
    together = generate(e, {k: case(arch, k)["prompt_ids"] for k in FOUR}, 24)
    e.close()
    assert {k: tokens(v) for k, v in together.items()} == {k: case(arch, k)["generated_ids"][:24] for k in FOUR}


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_in_chunks_equals_whole(arch):
    prose = case(arch, "long_prose")        # ~610 tokens, in chunks of 97
    e = engine(arch, n_batch=97)
    chunked = generate(e, {"r": prose["prompt_ids"]}, 24)["r"]
    e.close()
    assert tokens(chunked) == prose["generated_ids"][:24]
    assert max_logprob_deviation(chunked, steps(prose)) <= LOGPROB_TOL


@pytest.mark.parametrize("arch", ARCHS)
def test_reusing_a_cached_prefix_gives_the_same_tokens(arch):
    prefix = case(arch, "long_prose")["prompt_ids"][:200]
    question = case(arch, "capital")["prompt_ids"]
    e = engine(arch)
    fresh = tokens(generate(e, {"q": prefix + question}, 24)["q"])
    e.close()
    e = engine(arch, n_parallel=2)
    generate(e, {"warm": prefix + case(arch, "story")["prompt_ids"]}, 4)
    events = generate(e, {"q": prefix + question}, 24)["q"]      # reuses the warm prompt's prefix
    e.close()
    assert events[0].n_cached >= 190
    assert tokens(events) == fresh
