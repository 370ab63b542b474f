"""ggml's CPU backend comes in variants, one per x86 instruction-set level, as
llama.cpp's releases ship it (GGML_CPU_ALL_VARIANTS, ggml/src/CMakeLists.txt):
the names and features below are that list's from haswell up, AMX left out (a
hypervisor may advertise AMX and refuse its tile instructions).

`haswell` (AVX2) is the base build in the lib folder: the one the golden data
was made with. scripts/build_ggml.sh builds the others as further copies of
libggml-cpu.so under lib/cpu-variants/<name>/; native/__init__.py loads the best
one this CPU runs (or the one GGSERVE_CPU_VARIANT names) before the extensions,
so their libggml-cpu.so.0 is that copy. docs/numerics.md says which variant
reproduces which reference.

Standard library only: scripts/build_ggml.sh runs this file before anything is
installed (`python native/cpu_variants.py cmake-flags NAME | best-for-host`).
"""
import os
import sys

BASE = "haswell"
ENV = "GGSERVE_CPU_VARIANT"
SUBDIR = "cpu-variants"

_AVX2 = ("AVX", "F16C", "FMA", "AVX2", "BMI2")
# name -> ggml CMake features (GGML_<feature>=ON), in rising order of preference
FEATURES = {
    "haswell": _AVX2,
    "alderlake": _AVX2 + ("AVX_VNNI",),
    "skylakex": _AVX2 + ("AVX512",),
    "cascadelake": _AVX2 + ("AVX512", "AVX512_VNNI"),
    "icelake": _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI"),
    "cooperlake": _AVX2 + ("AVX512", "AVX512_VNNI", "AVX512_BF16"),
    "zen4": _AVX2 + ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"),
}

# the /proc/cpuinfo flags each feature's compiler switches need (GGML_AVX512 is
# -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw)
_CPU_FLAGS = {
    "AVX": {"avx"}, "F16C": {"f16c"}, "FMA": {"fma"}, "AVX2": {"avx2"}, "BMI2": {"bmi2"},
    "AVX_VNNI": {"avx_vnni"},
    "AVX512": {"avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"},
    "AVX512_VBMI": {"avx512vbmi"}, "AVX512_VNNI": {"avx512_vnni"}, "AVX512_BF16": {"avx512_bf16"},
}


class VariantError(ImportError):
    """ggml cannot be loaded as GGSERVE_CPU_VARIANT asks (the message says why)."""


def host_cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def runs_on(name: str, cpu_flags: set[str]) -> bool:
    return all(_CPU_FLAGS[feature] <= cpu_flags for feature in FEATURES[name])


def best_for(cpu_flags: set[str], available=FEATURES) -> str:
    """The last (most preferred) variant of `available` this CPU runs; the base otherwise."""
    runnable = [name for name in FEATURES if name in available and runs_on(name, cpu_flags)]
    return runnable[-1] if runnable else BASE


def installed(libdir: str) -> list[str]:
    """The variants a ggml install under `libdir` holds (the base always)."""
    found = [BASE]
    root = os.path.join(libdir, SUBDIR)
    for name in FEATURES:
        if name != BASE and os.path.exists(os.path.join(root, name, "libggml-cpu.so")):
            found.append(name)
    return found


def choose(libdir: str, requested: str | None = None, cpu_flags: set[str] | None = None) -> str:
    """The variant to load: the one requested (GGSERVE_CPU_VARIANT), checked
    against what is installed and what this CPU runs, else the best installed one."""
    cpu_flags = host_cpu_flags() if cpu_flags is None else cpu_flags
    have = installed(libdir)
    if not requested or requested == "auto":
        return best_for(cpu_flags, have)
    if requested not in FEATURES:
        raise VariantError(f"{ENV}={requested}: not a ggml CPU variant (one of: auto, {', '.join(FEATURES)})")
    if requested not in have:
        raise VariantError(f"{ENV}={requested}: not built into {libdir} (built: {', '.join(have)}; "
                           f"GGML_CPU_VARIANTS={requested} scripts/build_ggml.sh adds it)")
    if not runs_on(requested, cpu_flags):
        missing = sorted(set().union(*(_CPU_FLAGS[f] for f in FEATURES[requested])) - cpu_flags)
        raise VariantError(f"{ENV}={requested}: this CPU lacks {' '.join(missing)}")
    return requested


def library(libdir: str, name: str) -> str:
    """Path of variant `name`'s libggml-cpu.so."""
    if name == BASE:
        return os.path.join(libdir, "libggml-cpu.so")
    return os.path.join(libdir, SUBDIR, name, "libggml-cpu.so")


def _main(argv: list[str]) -> int:
    if argv[:1] == ["cmake-flags"] and len(argv) == 2 and argv[1] in FEATURES:
        print(" ".join(f"-DGGML_{feature}=ON" for feature in FEATURES[argv[1]]))
        return 0
    if argv == ["best-for-host"]:
        print(best_for(host_cpu_flags()))
        return 0
    if argv == ["names"]:
        print(" ".join(FEATURES))
        return 0
    print("usage: cpu_variants.py cmake-flags NAME | best-for-host | names", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
