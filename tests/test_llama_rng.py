"""llama.cpp's sampling RNG (server/engine/sampling/llama_rng.py): std::mt19937 written out."""
import subprocess
import sys

from ggserve.server.engine.sampling.llama_rng import MT19937, LlamaRng


def test_the_10000th_output_of_a_default_seeded_generator_is_the_one_cpp_requires():
    # C++ [rand.predef]: "the 10000th consecutive invocation of a default-constructed
    # object of type mt19937 shall produce the value 4123659995" (default seed 5489)
    mt = MT19937(5489)
    for _ in range(9999):
        mt.next32()
    assert mt.next32() == 4123659995


def test_a_seed_repeats_its_draws_and_another_seed_does_not():
    # llama-server's own draws with --seed 42: tests/test_llama_suite_items.py
    a, b, c = LlamaRng(1234), LlamaRng(1234), LlamaRng(1235)
    first = [a.random() for _ in range(700)]        # past a twist (312 draws each)
    assert first == [b.random() for _ in range(700)] and first[:3] != [c.random() for _ in range(3)]
    assert all(0.0 <= u < 1.0 for u in first)


def test_sampling_does_not_import_numpy_random():
    code = ("import sys; from ggserve.server.engine.sampling.llama_rng import LlamaRng; "
            "LlamaRng(7).random(); print('numpy.random' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
