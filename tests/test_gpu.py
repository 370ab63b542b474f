"""The engine with its layers offloaded to a GPU (ggml built with CUDA or another
GPU backend; skipped where the linked ggml has no GPU device).

The golden data come from llama.cpp on the CPU, and ggml's GPU kernels do not
reproduce its CPU kernels for 4-bit weights: one Q4_0 / Q4_1 matrix product
differs by up to ~1% (measured on an H100 with ggml 0.26: 0.84% / 0.15% relative;
F32 and Q8_0 agree to 1e-7), which over 30 layers moves logits by up to ~2 and
flips near-ties. So these tests check what must hold on any GPU: weights
arrive intact, exact types agree with the CPU to rounding, an offloaded model
makes the CPU model's decisions, images stay on the device.
"""
import hashlib
import json
import os
import pathlib
import tempfile

import gguf
import numpy as np
import pytest
from PIL import Image

from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from engine_helpers import GREEDY, build_prompt, turn_starts

HERE = pathlib.Path(__file__).parent
PROMPTS = [[1], [1, 504, 3458, 282, 4649, 314], list(range(500, 540))]


def _has_gpu() -> bool:
    b = ggml.Backend(n_threads=1)
    try:
        return bool(b.gpus)
    finally:
        b.close()


pytestmark = pytest.mark.skipif(not _has_gpu(), reason="the linked ggml has no GPU device")


def _matmul(use_gpu: bool, path: str, x: np.ndarray) -> np.ndarray:
    b = ggml.Backend(n_threads=2, use_gpu=use_gpu)
    try:
        w = {}
        for buf in b.load_weights(GGUFFile(path), {"w": b.devices[0]}).values():
            w.update(buf.tensors)
        with b.graph() as g:
            xi = g.input("x", ggml.F32, (x.shape[1], x.shape[0]))
            y = g.output(g.mul_mat(w["w"], xi))
            b.compute(g, {xi: x})
            return y.read().copy()
    finally:
        b.close()


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-6), ("Q8_0", 1e-6), ("Q4_1", 0.02)])
def test_a_matrix_product_on_the_gpu_agrees_with_the_cpu(qtype, tol):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((256, 576)).astype(np.float32) * 0.05
    x = rng.standard_normal((3, 576)).astype(np.float32)
    path = os.path.join(tempfile.mkdtemp(), "w.gguf")
    q = getattr(gguf.GGMLQuantizationType, qtype)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("w", weight if qtype == "F32" else gguf.quants.quantize(weight, q),
                 raw_dtype=None if qtype == "F32" else q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    cpu, gpu = _matmul(False, path, x), _matmul(True, path, x)
    assert np.abs(cpu - gpu).max() <= tol * np.abs(cpu).max()


def test_weights_are_copied_to_the_gpu_byte_for_byte(smollm2_path):
    f = GGUFFile(smollm2_path)
    name = "blk.0.attn_q.weight"
    b = ggml.Backend(n_threads=1)
    try:
        bufs = b.load_weights(f, {name: b.gpus[0]})
        t = next(buf.tensors[name] for buf in bufs.values() if name in buf.tensors)
        info = f.tensors[name]
        with open(smollm2_path, "rb") as fh:
            fh.seek(f.data_offset + info.offset)
            want = fh.read(info.nbytes)
        assert t.read_bytes()[:info.nbytes] == want
    finally:
        b.close()


@pytest.fixture(scope="module")
def offloaded(smollm2_path):
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_batch=512, n_parallel=1, n_gpu_layers=99))
    yield e
    e.close()


def test_every_layer_and_the_kv_cache_live_on_the_gpu(offloaded):
    gpu = offloaded.backend.gpus[0]
    on_gpu = {name for b in offloaded.loaded.weights.values() if b.device is gpu for name in b.tensors}
    assert {n for n in offloaded.loaded.gguf.tensors if n.startswith("blk.")} <= on_gpu
    assert offloaded.kv.nbytes_by_device().get(gpu.name, 0) > 0
    assert offloaded.kv.nbytes_by_device().get(offloaded.backend.cpu.name, 0) == 0


def test_a_tied_output_matrix_is_duplicated_onto_the_gpu(offloaded):
    # SmolLM2 ties its output to token_embd: the lookups stay on the CPU, the
    # vocabulary-sized product runs on the GPU (llama.cpp's TENSOR_DUPLICATED)
    gpu, cpu = offloaded.backend.gpus[0], offloaded.backend.cpu
    assert any(b.device is gpu and "output.weight" in b for b in offloaded.loaded.weights.values())
    assert any(b.device is cpu and "token_embd.weight" in b for b in offloaded.loaded.weights.values())
    assert offloaded.model.output.name == "output.weight"


def _last_logits(engine, ids):
    engine.clear_cache()
    engine.add(Request("r", ids, GREEDY, max_tokens=1, ignore_eos=True))
    kept = []
    run = engine.runner.run
    engine.runner.run = lambda *a: kept.append(run(*a)) or kept[-1]
    try:
        while engine.has_work():
            engine.step()
    finally:
        del engine.runner.run
    return kept[-1][-1]


@pytest.mark.parametrize("ids", PROMPTS, ids=["1", "6", "40"])
def test_an_offloaded_model_decides_as_on_the_cpu(smollm2_path, offloaded, ids):
    # measured on an H100: max |logit difference| 1.03 / 1.83 / 0.65, same argmax
    cpu = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_batch=512, n_parallel=1, n_threads=2))
    try:
        a, b = _last_logits(cpu, ids), _last_logits(offloaded, ids)
    finally:
        cpu.close()
    assert a.argmax() == b.argmax()
    assert np.abs(a - b).max() < 4.0


def test_an_image_is_encoded_and_kept_on_the_gpu(mmproj_dir, smollm2_path):
    golden = json.loads((HERE / "data" / "multimodal.json").read_text())["configs"]["mlp_f16"]
    case = next(r for r in golden["results"] if r["image"] == "grad_64x64.png")
    e = Engine(EngineConfig(smollm2_path, n_ctx=2048, n_batch=512, n_parallel=1, n_gpu_layers=99,
               mmproj=str(mmproj_dir / "mmproj-synth-mlp-f16.gguf")))
    try:
        path = HERE / "data" / "vision" / "grad_64x64.png"
        image = (hashlib.sha256(path.read_bytes()).hexdigest(), Image.open(path))
        prompt, spans = build_prompt(e, case["apply_template_prompt"], [image])
        e.add(Request("img", prompt, GREEDY, max_tokens=4, ignore_eos=True, images=spans,
                      turn_starts=turn_starts(e, prompt, spans)))
        events = []
        while e.has_work():
            events += e.step()
        assert [ev.token for ev in events][:1] == case["generated_ids"][:1]
        assert e.images.get(spans[0].key).device is e.backend.gpus[0]
    finally:
        e.close()
