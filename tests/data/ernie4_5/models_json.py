"""The models.json entries make_synth_golden.py reads for the two ERNIE 4.5 models
(file, bytes, sha256, tensor types), written beside them.

    python tests/data/ernie4_5/models_json.py MODELS_DIR   # holding synth-ernie4_5{,-moe}-q8_0.gguf
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import sys

import gguf

from ggserve.native.gguf_file import GGUFFile

ARCHS = ("ernie4_5", "ernie4_5-moe")


def _entry(path: str) -> dict:
    types = collections.Counter(gguf.GGMLQuantizationType(t.ggml_type).name for t in GGUFFile(path).tensors.values())
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path), "sha256": sha, "f32_sha256": None,
            "quantize_command": "none: tests/data/ernie4_5/make_model.py (gguf.quants)",
            "tensor_types": dict(sorted(types.items()))}


def main(models_dir: str) -> None:
    entries = {a: _entry(os.path.join(models_dir, f"synth-{a}-q8_0.gguf")) for a in ARCHS}
    with open(os.path.join(models_dir, "models.json"), "w") as f:
        json.dump(entries, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
