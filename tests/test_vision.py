"""Vision side of llama.cpp mmproj files: loading, preprocessing, token counts, encoders.

Data (tests/data/vision/, from shared/golden):
- make_mmproj.py regenerates the synthetic random-weight mmproj files byte for byte
  (their sha256 is checked against the golden's, so these are the files llama.cpp ran);
- vision_golden.json: image chunk sizes from llama-server's log, image tokens per batch
  from llama-mtmd-cli, the idefics3 grid of every image, the mmproj configs;
- decoded_stb.json + a few images: the exact pixels llama.cpp's stb_image decoded.
The golden has no embeddings: the encoders are checked against an independent numpy
implementation of llama.cpp's graphs, and f16 against f32 files of the same weights.
"""
import hashlib
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from ggserve.models.registry import ModelError
from ggserve.models.vision import VisionModel, to_rgb
from ggserve.models.vision import encoder as vision_encoder
from ggserve.models.vision.preprocess import BICUBIC, LLAVA_PAD_COLOR, fit_size, resize_pad
from ggserve.native import ggml

DATA = os.path.join(os.path.dirname(__file__), "data", "vision")
GOLDEN = json.load(open(os.path.join(DATA, "vision_golden.json")))
STB = {e["file"]: e for e in json.load(open(os.path.join(DATA, "decoded_stb.json")))["images"]}
PROJECTORS = ("gemma3", "idefics3", "mlp")


@pytest.fixture(scope="session")
def backend():
    b = ggml.Backend(n_threads=2, use_gpu=False)
    yield b
    b.close()


@pytest.fixture(scope="session")
def models(mmproj_dir, backend):
    out = {}
    for name in GOLDEN["mmproj"]:
        out[name] = VisionModel.from_gguf(mmproj_dir / name, backend)
    yield out
    for vm in out.values():
        vm.close()


def _file(projector, dtype):
    return f"mmproj-synth-{projector}-{dtype}.gguf"


def _image(name):
    """The pixels llama.cpp saw: stb's decode for JPEGs, the file itself for PNGs."""
    if name.endswith(".jpg"):
        return Image.open(os.path.join(DATA, name + ".stb.png"))
    return Image.open(os.path.join(DATA, name))


# -- loading ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(GOLDEN["mmproj"]))
def test_mmproj_loads_with_its_config(models, name):
    vm, info = models[name], GOLDEN["mmproj"][name]
    cfg = info["config"]
    assert vm.projector == info["projector_type"]
    assert vm.n_embd_out == cfg["n_embd_text"]
    c = vm.config
    assert (c.image_size, c.patch_size, c.n_embd, c.n_head, c.n_ff, c.n_layer) == \
        (cfg["image_size"], cfg["patch_size"], cfg["n_embd"], cfg["n_head"], cfg["n_ff"], cfg["n_layer"])
    assert c.ffn_op == ("gelu" if cfg["use_gelu"] else "gelu_quick")
    assert c.eps == pytest.approx(cfg["eps"])
    assert c.image_mean == pytest.approx(cfg["image_mean"]) and c.image_std == pytest.approx(cfg["image_std"])
    assert c.n_merge == {"gemma3": 4, "idefics3": cfg["proj_scale_factor"], "mlp": 1}[vm.projector]
    assert c.longest_edge == (cfg["preproc_image_size"] or 0)


def test_max_graph_reserves(models, backend):
    for name in (_file(p, "f16") for p in PROJECTORS):
        g = models[name].max_graph()
        try:
            backend.reserve(g)
        finally:
            g.close()
    assert backend.compute_bytes[backend.cpu.name] > 0


# -- token counts against llama.cpp ------------------------------------------------------

@pytest.mark.parametrize("case", GOLDEN["server"], ids=lambda c: f"{c['config']}-{c['image']}")
def test_tokens_per_image_equal_llama_server(models, case):
    vm = models[case["mmproj"]]
    w, h = case["image_size"]
    assert vm.tokens_per_image((w, h)) == case["image_tokens"]
    plan = vm.plan(w, h)
    assert [vm.tokens_per_tile] * plan.n_tiles == case["chunk_tokens"]
    if case["grid"] is not None:
        assert [plan.grid_x, plan.grid_y] == case["grid"]


# the run with the unmodified SmolLM2 aborts in llama.cpp (no image-wrapper tokens): no counts
@pytest.mark.parametrize("run", [r for r in GOLDEN["mtmd_cli"] if r["returncode"] == 0],
                         ids=lambda r: r["config"])
def test_tokens_per_batch_equal_llama_mtmd_cli(models, run):
    vm = models[run["mmproj"]]
    w, h = (int(x) for x in run["image"].rsplit("_", 1)[1].split(".")[0].split("x"))
    tiles = vm.preprocess(_image(run["image"]))
    assert [vm.tokens_per_tile] * len(tiles) == run["image_batches_n_tokens"]
    assert vm.tokens_per_image((w, h)) == run["image_tokens_total"]


LOCAL_IMAGES = sorted({c["image"] for c in GOLDEN["server"]
                       if os.path.exists(os.path.join(DATA, c["image"]))})


@pytest.mark.parametrize("image", LOCAL_IMAGES)
def test_idefics3_tiles_and_grid(models, image):
    vm = models[_file("idefics3", "f16")]
    case = next(c for c in GOLDEN["server"] if c["config"] == "idefics3_f16" and c["image"] == image)
    tiles = vm.preprocess(_image(image))
    gx, gy = case["grid"]
    assert (tiles.grid_x, tiles.grid_y) == (gx, gy)
    assert len(tiles) == gx * gy + 1 == len(case["chunk_tokens"])
    for t in tiles:
        assert t.shape == (3, 512, 512) and t.dtype == np.float32 and t.flags.c_contiguous
    assert vm.tokens_per_image(_image(image)) == case["image_tokens"]


@pytest.mark.parametrize("projector,side", [("gemma3", 896), ("mlp", 336)])
@pytest.mark.parametrize("image", LOCAL_IMAGES)
def test_fixed_size_tiles(models, projector, side, image):
    tiles = models[_file(projector, "f16")].preprocess(_image(image))
    assert len(tiles) == 1 and (tiles.grid_x, tiles.grid_y) == (0, 0)
    assert tiles[0].shape == (3, side, side) and tiles[0].dtype == np.float32


def test_pad_ceil_geometry_and_colours(models):
    # 300x200 into 896: scale 2.9867 -> 896 x ceil(597.33) = 598, centred at y = 149
    assert fit_size(300, 200, 896, 896) == (896, 598)
    assert fit_size(200, 600, 336, 336) == (112, 336)
    assert fit_size(1, 1, 896, 896) == (896, 896)
    img = _image("checker_300x200.png")
    g = models[_file("gemma3", "f16")].preprocess(img)[0]
    black = (0.0 - 0.5) / 0.5
    assert np.all(g[:, :149, :] == black) and np.all(g[:, 149 + 598:, :] == black)
    assert not np.all(g[:, 149, :] == black)
    m = models[_file("mlp", "f16")]
    t = m.preprocess(img)[0]                          # 336 x 224 at y = 56
    mean, std = np.float32(m.config.image_mean), np.float32(m.config.image_std)
    pad = (np.float32([122, 116, 104]) / np.float32(255) - mean) / std
    assert np.all(t[:, :56, :] == pad[:, None, None]) and np.all(t[:, 56 + 224:, :] == pad[:, None, None])


def test_tall_image_shrinks_horizontal_pass_first():
    # llama.cpp's resize_pillow runs the horizontal pass first; Pillow 13's own
    # two-axis resize runs the vertical one first when a tall image shrinks (200x600
    # -> 112x336: 1147 bytes off, by up to 14). The sha256 is of the 336x336 bytes
    # llama.cpp's img_tool::resize (bicubic, PAD_CEIL, LLaVA pad colour) produced.
    rgb = to_rgb(_image("tall_200x600.png"))
    sq = resize_pad(rgb, 336, BICUBIC, LLAVA_PAD_COLOR)
    assert hashlib.sha256(sq.tobytes()).hexdigest() == \
        "3fc1d11c6ae4d38364ab25e47f5820a21b3199e59e3caaa480943bacabb2f4ca"


def test_normalisation_is_llama_cpp_float32(models):
    vm = models[_file("gemma3", "f32")]
    rgb = np.full((896, 896, 3), 200, dtype=np.uint8)
    rgb[0, 0] = (0, 128, 255)
    t = vm.preprocess(rgb)[0]
    f = np.float32
    assert t[0, 1, 1] == (f(200) / f(255) - f(0.5)) / f(0.5)
    assert [t[c, 0, 0] for c in range(3)] == [(f(v) / f(255) - f(0.5)) / f(0.5) for v in (0, 128, 255)]


# -- decoding like stb_image ----------------------------------------------------------------

@pytest.mark.parametrize("image", [i for i in LOCAL_IMAGES if i.endswith(".png")])
def test_png_decodes_to_stb_pixels(image):
    rgb = to_rgb(Image.open(os.path.join(DATA, image)))
    e = STB[image]
    assert rgb.shape == (e["height"], e["width"], 3)
    assert hashlib.sha256(rgb.tobytes()).hexdigest() == e["rgb_sha256"]


def test_jpeg_uses_stb_decode():
    e = STB["checker_300x200.jpg"]
    stb = to_rgb(Image.open(os.path.join(DATA, "checker_300x200.jpg.stb.png")))
    assert hashlib.sha256(stb.tobytes()).hexdigest() == e["rgb_sha256"]
    pil = to_rgb(Image.open(os.path.join(DATA, "checker_300x200.jpg")))
    # Pillow's libjpeg differs from stb by a few levels: the reason tests feed stb's pixels
    assert 0 < np.abs(pil.astype(int) - stb.astype(int)).max() <= 3


def test_alpha_dropped_without_compositing():
    rgba = np.zeros((2, 2, 4), dtype=np.uint8)
    rgba[..., :3] = (10, 20, 30)
    rgba[..., 3] = 0
    assert np.all(to_rgb(Image.fromarray(rgba, "RGBA")) == (10, 20, 30))
    la = Image.fromarray(np.array([[7, 9]], dtype=np.uint8), "L").convert("LA")
    assert to_rgb(la).tolist() == [[[7, 7, 7], [9, 9, 9]]]
    i16 = Image.fromarray(np.array([[0x1234, 0xFFFF]], dtype=np.uint16))
    assert to_rgb(i16).tolist() == [[[0x12] * 3, [0xFF] * 3]]


# -- encoders ------------------------------------------------------------------------------

ENC_IMAGE = "checker_300x200.png"


@pytest.fixture(scope="module")
def embeddings(models):
    """{(projector, dtype): (tiles, [embeddings per tile], seconds per tile)} for one image."""
    out = {}
    for p in PROJECTORS:
        for dt in ("f16", "f32"):
            vm = models[_file(p, dt)]
            tiles = vm.preprocess(_image(ENC_IMAGE))
            n = 2 if p == "idefics3" else 1       # a tile and (below) the overview
            sel = tiles[:1] + tiles[-1:] if n == 2 else tiles
            t0 = time.perf_counter()
            embs = [vm.encode(t) for t in sel]
            out[p, dt] = (sel, embs, (time.perf_counter() - t0) / len(sel))
    return out


@pytest.mark.parametrize("projector", PROJECTORS)
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_encode_shape_and_finite(models, embeddings, projector, dtype):
    vm = models[_file(projector, dtype)]
    _, embs, _ = embeddings[projector, dtype]
    for e in embs:
        assert e.shape == (vm.tokens_per_tile, vm.n_embd_out) and e.dtype == np.float32
        assert np.isfinite(e).all()
        # make_mmproj.py scales the last projection to the paired text model's embedding RMS
        target = GOLDEN["mmproj"][_file(projector, dtype)]["config"]["target_out_rms"]
        assert 0.5 * target < float(np.sqrt(np.mean(e ** 2))) < 2 * target


@pytest.mark.parametrize("projector", PROJECTORS)
def test_f16_and_f32_files_agree(embeddings, projector):
    # same seed, same draw order: the f16 file holds the f16-rounded f32 weights
    f16, f32 = GOLDEN["mmproj"][_file(projector, "f16")], GOLDEN["mmproj"][_file(projector, "f32")]
    assert f16["config"]["seed"] == f32["config"]["seed"] and f16["tensors"] == f32["tensors"]
    for a, b in zip(embeddings[projector, "f16"][1], embeddings[projector, "f32"][1]):
        cos = np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        assert cos.min() > 0.9999
        assert np.abs(a - b).max() < 2e-3 * np.abs(b).max() * 10


# an independent numpy implementation of llama.cpp's clip graphs (f32 weights)

def _np_weights(path):
    import gguf

    r = gguf.GGUFReader(str(path))
    return {t.name: np.asarray(t.data, dtype=np.float32).reshape([int(x) for x in reversed(t.shape)])
            for t in r.tensors}


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def _gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _np_vit(W, cfg, x, n_blocks, act):
    e, nh = cfg.n_embd, cfg.n_head
    d = e // nh
    if "v.pre_ln.weight" in W:
        x = _ln(x, W["v.pre_ln.weight"], W["v.pre_ln.bias"], cfg.eps)
    for i in range(n_blocks):
        p = f"v.blk.{i}."
        h = _ln(x, W[p + "ln1.weight"], W[p + "ln1.bias"], cfg.eps)
        q, k, v = ((h @ W[p + f"attn_{n}.weight"].T + W[p + f"attn_{n}.bias"]).reshape(-1, nh, d).transpose(1, 0, 2)
                   for n in "qkv")
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = (s / s.sum(-1, keepdims=True)) @ v                       # [nh, n, d]
        a = a.transpose(1, 0, 2).reshape(-1, e)
        x = x + a @ W[p + "attn_out.weight"].T + W[p + "attn_out.bias"]
        h = _ln(x, W[p + "ln2.weight"], W[p + "ln2.bias"], cfg.eps)
        h = act(h @ W[p + "ffn_up.weight"].T + W[p + "ffn_up.bias"])
        x = x + h @ W[p + "ffn_down.weight"].T + W[p + "ffn_down.bias"]
    if "v.post_ln.weight" in W:
        x = _ln(x, W["v.post_ln.weight"], W["v.post_ln.bias"], cfg.eps)
    return x


def _np_encode(W, cfg, tile):
    P = cfg.patch_size
    _, H, Wd = tile.shape
    ny, nx = H // P, Wd // P
    patches = tile.reshape(3, ny, P, nx, P).transpose(1, 3, 0, 2, 4).reshape(ny * nx, 3 * P * P)
    x = patches @ W["v.patch_embd.weight"].reshape(cfg.n_embd, -1).T   # [n, e], row y*nx + x
    if "v.patch_embd.bias" in W:
        x = x + W["v.patch_embd.bias"]
    if cfg.projector == "mlp":
        x = np.concatenate([x, W["v.class_embd"][None]], 0)        # llama.cpp: CLS last
        x = x + W["v.position_embd.weight"]
        x = _np_vit(W, cfg, x, cfg.n_layer - 1, lambda t: t * (1 / (1 + np.exp(-1.702 * t))))
        x = x[1:]                                                     # "patches" = rows 1..n
        x = _gelu(x @ W["mm.0.weight"].T + W["mm.0.bias"])
        return x @ W["mm.2.weight"].T + W["mm.2.bias"]
    x = _np_vit(W, cfg, x + W["v.position_embd.weight"], cfg.n_layer, _gelu)
    s, e = cfg.n_merge, cfg.n_embd
    if cfg.projector == "gemma3":
        x = x.reshape(ny // s, s, nx // s, s, e).mean((1, 3)).reshape(-1, e)
        x = x / np.sqrt((x ** 2).mean(-1, keepdims=True) + cfg.eps) * W["mm.soft_emb_norm.weight"]
        return x @ W["mm.input_projection.weight"]
    # idefics3 pixel shuffle: token (Y, X) holds patches (Y*s + dy, X*s + dx), features (dy, dx, c)
    x = x.reshape(ny // s, s, nx // s, s, e).transpose(0, 2, 1, 3, 4).reshape((ny // s) * (nx // s), -1)
    return x @ W["mm.model.fc.weight"].T


@pytest.mark.parametrize("projector", PROJECTORS)
def test_encode_matches_numpy_reference(mmproj_dir, models, embeddings, projector):
    name = _file(projector, "f32")
    W = _np_weights(mmproj_dir / name)
    tiles, embs, _ = embeddings[projector, "f32"]
    for tile, got in zip(tiles, embs):
        want = _np_encode(W, models[name].config, tile.astype(np.float64)).astype(np.float32)
        # ggml casts K/V to f16 for flash attention (as llama.cpp does): ~1e-3 relative
        assert np.abs(got - want).max() < 5e-3 * np.abs(want).max()
        cos = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cos.min() > 0.9999


def test_llava_cls_last_is_what_llama_cpp_does():
    assert vision_encoder.LLAVA_CLS_LAST


def test_encode_rejects_bad_tiles(models):
    vm = models[_file("mlp", "f16")]
    with pytest.raises(ValueError):
        vm.encode(np.zeros((336, 336, 3), dtype=np.float32))
    with pytest.raises(ValueError):
        vm.encode(np.zeros((3, 330, 336), dtype=np.float32))


# -- bad files -----------------------------------------------------------------------------

def test_truncated_mmproj(mmproj_dir, tmp_path, backend):
    src = (mmproj_dir / _file("mlp", "f16")).read_bytes()
    for n in (len(src) // 2, 200, 3):
        bad = tmp_path / f"truncated_{n}.gguf"
        bad.write_bytes(src[:n])
        with pytest.raises(ModelError, match=str(bad)):
            VisionModel.from_gguf(bad, backend)


def test_corrupt_mmproj(mmproj_dir, tmp_path, backend):
    src = bytearray((mmproj_dir / _file("gemma3", "f16")).read_bytes())
    src[8:24] = b"\xff" * 16                   # absurd tensor / kv counts
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(bytes(src))
    with pytest.raises(ModelError, match=str(bad)):
        VisionModel.from_gguf(bad, backend)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelError, match=str(junk)):
        VisionModel.from_gguf(junk, backend)
    with pytest.raises(ModelError, match="missing.gguf"):
        VisionModel.from_gguf(tmp_path / "missing.gguf", backend)


def _write_clip(path, projector="cogvlm", arch="clip", drop=()):
    import gguf

    w = gguf.GGUFWriter(str(path), arch=arch)
    if arch == "clip":
        w.add_bool("clip.has_vision_encoder", True)
        w.add_string("clip.projector_type", projector)
        for k, v in [("image_size", 28), ("patch_size", 14), ("embedding_length", 8),
                     ("feed_forward_length", 16), ("block_count", 1), ("attention.head_count", 2)]:
            if k not in drop:
                w.add_uint32(f"clip.vision.{k}", v)
        w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
        w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
        w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_tensor("v.patch_embd.weight", np.zeros((8, 3, 14, 14), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_unknown_projector_type(tmp_path, backend):
    p = tmp_path / "cogvlm.gguf"
    _write_clip(p)
    with pytest.raises(ModelError, match=rf"{p}.*unsupported projector type 'cogvlm'"):
        VisionModel.from_gguf(p, backend)


def test_not_an_mmproj_or_incomplete(tmp_path, backend):
    p = tmp_path / "llama.gguf"
    _write_clip(p, arch="llama")
    with pytest.raises(ModelError, match=rf"{p}.*not an mmproj"):
        VisionModel.from_gguf(p, backend)
    p = tmp_path / "nolayers.gguf"
    _write_clip(p, projector="gemma3", drop=("block_count",))
    with pytest.raises(ModelError, match=rf"{p}.*clip.vision.block_count"):
        VisionModel.from_gguf(p, backend)
    p = tmp_path / "noweights.gguf"
    _write_clip(p, projector="idefics3")
    with pytest.raises(ModelError, match=str(p)):
        VisionModel.from_gguf(p, backend)
