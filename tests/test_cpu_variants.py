"""ggml's CPU backend in variants, one per x86 instruction-set level, as llama.cpp's
releases ship it (native/cpu_variants.py): the best one this CPU runs is loaded,
or the one GGSERVE_CPU_VARIANT names. The tests run the AVX2 one (conftest.py),
which reproduces the AVX2 goldens; another variant answers as llama.cpp built for
the same instruction sets (tests/data/cpu_variants/, recorded by llama-server).
"""
import json
import os
import pathlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

import ggserve.native
from ggserve.native import cpu_variants
from ggserve.native._linked import LIBDIR

from engine_helpers import max_logprob_deviation

HERE = pathlib.Path(__file__).parent
NEAR_TIE = 0.02       # accepted divergence: llama.cpp's own top-2 gap below this
LOGPROB_TOL = 0.002   # the AVX2 variant against the AVX2 goldens: within 5e-4

HASWELL_CPU = {"avx", "avx2", "fma", "f16c", "bmi2", "sse4_2"}
ALDERLAKE_CPU = HASWELL_CPU | {"avx_vnni"}
AVX512 = {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"}
ZEN4_CPU = ALDERLAKE_CPU | AVX512 | {"avx512vbmi", "avx512_vnni", "avx512_bf16", "avx512ifma"}


def test_an_avx2_cpu_runs_the_base_build():
    assert cpu_variants.best_for(HASWELL_CPU) == "haswell"


def test_a_cpu_with_avx_vnni_and_no_avx512_runs_alderlake():
    assert cpu_variants.best_for(ALDERLAKE_CPU) == "alderlake"


def test_the_best_variant_built_is_chosen():
    assert cpu_variants.best_for(ZEN4_CPU) == "zen4"
    assert cpu_variants.best_for(ZEN4_CPU, available=["haswell", "skylakex", "icelake"]) == "icelake"
    assert cpu_variants.best_for(HASWELL_CPU | AVX512, available=["haswell", "icelake"]) == "haswell"


@pytest.fixture
def libdir_with_zen4(tmp_path):
    (tmp_path / "cpu-variants" / "zen4").mkdir(parents=True)
    (tmp_path / "cpu-variants" / "zen4" / "libggml-cpu.so").write_bytes(b"")
    return str(tmp_path)


def test_auto_picks_what_is_built_and_runs(libdir_with_zen4):
    assert cpu_variants.choose(libdir_with_zen4, "auto", ZEN4_CPU) == "zen4"
    assert cpu_variants.choose(libdir_with_zen4, None, HASWELL_CPU | AVX512) == "haswell"


def test_a_named_variant_is_loaded_from_its_folder(libdir_with_zen4):
    assert cpu_variants.choose(libdir_with_zen4, "haswell", ZEN4_CPU) == "haswell"
    assert cpu_variants.library(libdir_with_zen4, "zen4") == os.path.join(
        libdir_with_zen4, "cpu-variants", "zen4", "libggml-cpu.so")


def test_an_unknown_variant_is_refused_with_the_names(libdir_with_zen4):
    with pytest.raises(cpu_variants.VariantError, match="GGSERVE_CPU_VARIANT=zen9: not a ggml CPU variant.*icelake"):
        cpu_variants.choose(libdir_with_zen4, "zen9", ZEN4_CPU)


def test_a_variant_not_built_is_refused_saying_how_to_build_it(libdir_with_zen4):
    with pytest.raises(cpu_variants.VariantError, match="icelake: not built.*GGML_CPU_VARIANTS=icelake"):
        cpu_variants.choose(libdir_with_zen4, "icelake", ZEN4_CPU)


def test_a_variant_this_cpu_cannot_run_is_refused(libdir_with_zen4):
    with pytest.raises(cpu_variants.VariantError, match="zen4: this CPU lacks avx512_bf16 avx512_vnni avx512bw"):
        cpu_variants.choose(libdir_with_zen4, "zen4", HASWELL_CPU | {"avx512f"})


def test_the_build_script_takes_each_variants_flags_from_the_table():
    out = subprocess.run([sys.executable, cpu_variants.__file__, "cmake-flags", "icelake"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["-DGGML_AVX=ON", "-DGGML_F16C=ON", "-DGGML_FMA=ON", "-DGGML_AVX2=ON", "-DGGML_BMI2=ON",
                   "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON"]


def _loaded_cpu_library() -> str:
    return next(line.split()[-1] for line in open("/proc/self/maps") if "libggml-cpu" in line)


def test_the_tests_run_the_avx2_variant_the_goldens_were_made_with():
    assert os.environ[cpu_variants.ENV] == "haswell"
    assert ggserve.native.CPU_VARIANT == "haswell"
    assert os.path.realpath(_loaded_cpu_library()) == os.path.realpath(os.path.join(LIBDIR, "libggml-cpu.so"))


def _reference(variant: str) -> pathlib.Path:
    """llama.cpp's answers for a variant. Recorded by each variant's own llama-server
    build (tests/data/cpu_variants/record_llama_server.py): the five AVX512 builds
    answered identically, and alderlake's (AVX2 + AVX_VNNI) as the AVX2 goldens."""
    if "AVX512" in cpu_variants.FEATURES[variant]:
        return HERE / "data" / "cpu_variants" / "completions_avx512.json"
    return HERE / "data" / "completions.json"


def test_another_variant_answers_as_llama_cpp_built_for_it(smollm2_path, gemma3_path):
    variant = cpu_variants.best_for(cpu_variants.host_cpu_flags(), cpu_variants.installed(LIBDIR))
    if variant == cpu_variants.BASE:
        pytest.skip("no variant but the AVX2 one is built for this CPU (the golden tests run that one)")
    recording = _reference(variant)
    run = subprocess.run([sys.executable, str(HERE / "cpu_variant_answers.py"), str(recording), smollm2_path, gemma3_path],
                         env={**os.environ, cpu_variants.ENV: variant}, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    answers = json.loads(run.stdout)
    assert answers["variant"] == variant
    for model, cases in json.loads(recording.read_text())["models"].items():
        for case in cases:
            events = [SimpleNamespace(token=t, top_logprobs=top) for t, top in answers["models"][model][case["key"]]]
            ours, theirs = [e.token for e in events], case["generated_ids"]
            i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            if i is not None:
                step = case["steps"][i]
                top = sorted((lp for _, lp in step["top_logprobs"]), reverse=True)
                assert step["probs_available"] and top[0] - top[1] < NEAR_TIE, f"{model} {case['key']}: diverged at step {i}"
            assert max_logprob_deviation(events, case["steps"]) <= LOGPROB_TOL, f"{model} {case['key']}"


def test_serve_says_which_variant_runs(smollm2_path):
    proc = subprocess.Popen([sys.executable, "-m", "ggserve.server.cli.main", "serve", "-m", smollm2_path, "--port", "0"],
                            env={**os.environ, cpu_variants.ENV: "haswell"}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()
    finally:
        proc.kill()
        proc.wait()
    assert first == "ggserve: ggml CPU variant haswell (AVX F16C FMA AVX2 BMI2; GGSERVE_CPU_VARIANT chooses another)\n"


def test_serve_refuses_an_unknown_variant_in_one_line():
    run = subprocess.run([sys.executable, "-m", "ggserve.server.cli.main", "serve", "-m", "model.gguf"],
                         env={**os.environ, cpu_variants.ENV: "zen9"}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.startswith("ggserve: GGSERVE_CPU_VARIANT=zen9: not a ggml CPU variant (one of: auto, haswell,")
    assert run.stderr.count("\n") == 1
