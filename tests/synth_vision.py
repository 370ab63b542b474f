"""The synth-vision golden data (../shared/golden/synth-vision) and engines on its
files, shared by the vision-family tests (not a test module itself)."""
import hashlib
import json
import pathlib

import pytest
from PIL import Image

from ggserve.server.engine.engine import EngineConfig, Engine

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "shared" / "golden"
SYNTH = GOLDEN / "synth-vision"
CONFIGS = json.loads((SYNTH / "out" / "multimodal.json").read_text())["configs"]
TWO = "checker_300x200.png+tall_200x600.png"       # the two-image request
LOGPROB_TOL = 0.01


def _cfg(family):
    return CONFIGS[f"synth_{family}"]


def _image(name):
    """(sha256 of the file bytes, the pixels llama.cpp decoded)."""
    data = (GOLDEN / "images" / name).read_bytes()
    path = GOLDEN / "images" / "decoded_stb" / f"{name}.stb.png" if name.endswith(".jpg") else GOLDEN / "images" / name
    img = Image.open(path)
    img.load()
    return hashlib.sha256(data).hexdigest(), img


def _mmproj(family):
    return str(SYNTH / "models" / _cfg(family)["mmproj"])


def _engine(family, **kw):
    args = dict(n_ctx=8192, n_batch=512, n_parallel=1, n_threads=2)
    args.update(kw)
    return Engine(EngineConfig(str(SYNTH / "models" / _cfg(family)["text_model"]), mmproj=_mmproj(family), **args))


@pytest.fixture(scope="module")
def engines():
    made = {}
    yield lambda family: made.setdefault(family, _engine(family))
    for e in made.values():
        e.close()
