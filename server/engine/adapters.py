"""LoRA adapters and control vectors (llama.cpp's --lora, --lora-scaled, --control-vector):
loaded beside the model's weights, checked against them, held for the server's life.

ref: llama.cpp src/llama-adapter.cpp (llama_adapter_lora_init_impl, llama_adapter_cvec),
common/common.cpp (common_control_vector_load). An adapter's pair for a weight W of
[n_in, n_out] is lora_a [n_in, rank] and lora_b [rank, n_out]; the graph adds
scale * B (A x) to W x with scale = user scale * alpha / rank (the user scale alone where
alpha is 0), as llama.cpp's build_lora_mm (server/engine/adapter_step.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ggserve.models.registry import ModelError
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.engine.kernel_parity import SGEMM_TYPES


@dataclass(frozen=True)
class AdapterConfig:
    """The flags: LoRA files with their starting scales, control vectors with theirs."""
    lora: tuple[tuple[str, float], ...] = ()             # --lora (scale 1), --lora-scaled FNAME:SCALE
    control_vectors: tuple[tuple[str, float], ...] = ()  # --control-vector, --control-vector-scaled
    control_layers: tuple[int, int] = (-1, -1)           # --control-vector-layer-range START END


@dataclass
class LoraPair:
    a: object      # ne [n_in, rank]
    b: object      # ne [rank, n_out]

    @property
    def rank(self) -> int:
        return self.b.ne[0]


@dataclass
class LoraAdapter:
    path: str
    alpha: float
    task_name: str
    prompt_prefix: str
    pairs: dict = field(default_factory=dict)      # base weight tensor -> LoraPair

    @property
    def ranks(self) -> list[int]:
        return sorted({p.rank for p in self.pairs.values()})

    def scale(self, user_scale: float, rank: int) -> np.float32:
        """llama_adapter_lora_weight::get_scale, in float32 as llama.cpp computes it."""
        s, alpha = np.float32(user_scale), np.float32(self.alpha)
        return s * alpha / np.float32(rank) if alpha else s


class Adapters:
    """The loaded LoRA adapters (ids in flag order), the server-wide default scales
    (`scales`, which POST /lora-adapters changes) and the control vector per layer."""

    def __init__(self, loras: list[LoraAdapter], scales: list[float], control: dict, lora_buffers: list,
                 control_buffers: list):
        self.loras = loras
        self.scales = scales
        self.control = control        # layer -> f32 [n_embd] tensor added to that layer's output
        self._lora_buffers = lora_buffers
        self._buffers = lora_buffers + control_buffers

    def kernel_kinds(self) -> dict:
        """Adapter matrices whose CPU kernel depends on the call's row count: float ones
        on the CPU take tinyBLAS for >= 2 rows (server/engine/kernel_parity.py, "sgemm")."""
        return {t: "sgemm" for b in self._lora_buffers if b.device.is_cpu for t in b.tensors.values()
                if ggml.type_name(t.type) in SGEMM_TYPES}

    def close(self) -> None:
        for b in self._buffers:
            b.close()
        self._buffers = []


def load_adapters(cfg: AdapterConfig | None, backend, weights: dict, arch: str, n_embd: int, n_layer: int) -> Adapters:
    """weights: the model's buffers ({key: Buffer}); raises ModelError naming the file (and
    tensor) of an adapter that does not fit the model."""
    cfg = cfg or AdapterConfig()
    base = {}                              # tensor name -> (tensor, device)
    for buf in weights.values():
        for name, t in buf.tensors.items():
            base.setdefault(name, (t, buf.device))
    loras, buffers = [], []
    for path, _ in cfg.lora:
        lora, bufs = _load_lora(path, backend, base, arch)
        loras.append(lora)
        buffers += bufs
    control, control_buffers = _load_control(cfg, backend, n_embd, n_layer) if cfg.control_vectors else ({}, [])
    return Adapters(loras, [float(s) for _, s in cfg.lora], control, buffers, control_buffers)


def _load_lora(path: str, backend, base: dict, arch: str):
    try:
        f = GGUFFile(path)
    except (OSError, ValueError) as e:
        raise ModelError(f"LoRA adapter {path}: {e}") from None
    meta = f.metadata
    if meta.get("general.type") != "adapter":
        raise ModelError(f"LoRA adapter {path}: general.type is {meta.get('general.type')!r}, expected 'adapter'")
    if f.architecture != arch:
        raise ModelError(f"LoRA adapter {path}: for architecture {f.architecture!r}, the model is {arch!r}")
    if meta.get("adapter.type") != "lora":
        raise ModelError(f"LoRA adapter {path}: adapter.type is {meta.get('adapter.type')!r}, expected 'lora'")
    halves: dict[str, dict] = {}
    for name in f.tensors:
        for part in ("a", "b"):
            if name.endswith(".lora_" + part):
                halves.setdefault(name[: -len(".lora_a")], {})[part] = name
                break
        else:
            if not name.endswith("_norm.weight"):       # llama.cpp skips norm tensors too
                raise ModelError(f"LoRA adapter {path}: tensor {name!r} has an unexpected suffix")
    placement = {}
    for name, ab in halves.items():
        if len(ab) != 2:
            raise ModelError(f"LoRA adapter {path}: tensor {name!r} lacks its lora_a or lora_b")
        if name not in base:
            raise ModelError(f"LoRA adapter {path}: tensor {name!r} does not exist in the model")
        if name == "token_embd.weight" or "_exps" in name:
            raise ModelError(f"LoRA adapter {path}: tensor {name!r}: adapters of token embeddings or "
                             "expert stacks are not supported")
        w, device = base[name]
        a, b = f.tensors[ab["a"]].ne, f.tensors[ab["b"]].ne
        if w.ne[0] != a[0] or w.ne[1] != b[1] or a[1] != b[0]:
            raise ModelError(f"LoRA adapter {path}: tensor {name!r} has shape a {tuple(a)}, b {tuple(b)}, "
                             f"which does not fit the model's {tuple(w.ne[:2])}")
        placement[ab["a"]] = placement[ab["b"]] = device
    bufs = backend.load_weights(f, placement)
    loaded = {}
    for buf in bufs.values():
        loaded.update(buf.tensors)
    lora = LoraAdapter(path, float(meta.get("adapter.lora.alpha", 0.0)), meta.get("adapter.lora.task_name", ""),
                       meta.get("adapter.lora.prompt_prefix", ""))
    for name, ab in halves.items():
        lora.pairs[base[name][0]] = LoraPair(loaded[ab["a"]], loaded[ab["b"]])
    return lora, list(bufs.values())


def _load_control(cfg: AdapterConfig, backend, n_embd: int, n_layer: int):
    """One f32 vector per layer: every file's directions times its scale, summed (in float32
    as common_control_vector_load), for the layers in the range (default 1 .. n_layer)."""
    total = np.zeros((n_layer, n_embd), np.float32)
    for path, strength in cfg.control_vectors:
        try:
            f = GGUFFile(path)
        except (OSError, ValueError) as e:
            raise ModelError(f"control vector {path}: {e}") from None
        values = _directions(f, path)
        for il, v in values.items():
            if len(v) != n_embd:
                raise ModelError(f"control vector {path}: direction.{il} has {len(v)} values, "
                                 f"the model's n_embd is {n_embd}")
            if il < n_layer:
                total[il] += v * np.float32(strength)
    start, end = cfg.control_layers
    start, end = start if start > 0 else 1, end if end > 0 else n_layer
    layers = [il for il in range(1, n_layer) if start <= il <= end]
    if not layers:
        return {}, []
    buf = backend.alloc(backend.cpu, [(f"control.{il}", ggml.F32, (n_embd,)) for il in layers])
    for il in layers:
        buf[f"control.{il}"].write(total[il])
    return {il: buf[f"control.{il}"] for il in layers}, [buf]


def _directions(f: GGUFFile, path: str) -> dict[int, np.ndarray]:
    out = {}
    with open(path, "rb") as fh:
        for name, info in f.tensors.items():
            prefix, _, idx = name.partition(".")
            if prefix != "direction" or not idx.isdigit() or int(idx) == 0:
                raise ModelError(f"control vector {path}: tensor {name!r} is not direction.<layer from 1>")
            if ggml.type_name(info.ggml_type) != "f32" or len([d for d in info.ne if d > 1]) > 1:
                raise ModelError(f"control vector {path}: {name!r} is not a 1-D f32 tensor")
            fh.seek(f.data_offset + info.offset)
            out[int(idx)] = np.frombuffer(fh.read(4 * int(np.prod(info.ne))), dtype=np.float32)
    return out
