"""The models.json entry make_synth_golden.py reads for the hunyuan-moe model
(file, bytes, sha256, tensor types), written beside the model.

    python tests/data/hunyuan_moe/models_json.py MODELS_DIR/synth-hunyuan-moe-q8_0.gguf
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import sys

import gguf

from ggserve.native.gguf_file import GGUFFile


def main(path: str) -> None:
    types = collections.Counter(gguf.GGMLQuantizationType(t.ggml_type).name for t in GGUFFile(path).tensors.values())
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    entry = {"file": os.path.basename(path), "bytes": os.path.getsize(path), "sha256": sha, "f32_sha256": None,
             "quantize_command": "none: tests/data/hunyuan_moe/make_model.py (gguf.quants)",
             "tensor_types": dict(sorted(types.items()))}
    with open(os.path.join(os.path.dirname(path), "models.json"), "w") as f:
        json.dump({"hunyuan-moe": entry}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
