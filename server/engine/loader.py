"""Loading a model: its GGUF file, weights placed on devices, the model object,
its tokenizer and chat template, and the optional vision model. A file that
cannot be loaded raises ModelError naming it."""
from __future__ import annotations

import functools
import logging
import os
import socket

import numpy as np

from ggserve.models.registry import ModelError, model_class
from ggserve.models.tokenizer import Tokenizer
from ggserve.models.weights import matmul_weight_names
from ggserve.native import ggml
from ggserve.native.gguf_file import GGUFFile
from ggserve.server.engine.adapters import AdapterConfig, load_adapters
from ggserve.server.engine.cpu_topology import default_threads
from ggserve.server.engine.images.media import MediaModels
from ggserve.server.engine.kernel_parity import SGEMM_TYPES, TILED_TYPES

log = logging.getLogger("ggserve.loader")


def assign_layers(n_layer: int, n_gpu_layers: int, devices: list, cpu, tensor_split=()) -> list:
    """The device of each of the n_layer blocks and of the output layer (last), by
    llama.cpp's rule (llama-model.cpp, load_tensors): of the n_layer + 1 layers the
    last n_gpu_layers go to the devices (remote ones, then local GPUs), which take
    consecutive runs in proportion to tensor_split (by default to their free
    memory); the others stay on the CPU."""
    if not devices or n_gpu_layers <= 0:
        return [cpu] * (n_layer + 1)
    split = [float(x) for x in tensor_split[:len(devices)]] + [0.0] * max(0, len(devices) - len(tensor_split))
    if not any(split):
        split = [_free_memory(d, cpu) for d in devices]
    # float32 as in llama.cpp, so a layer on a boundary goes where llama.cpp puts it
    bounds = np.cumsum(np.array(split, dtype=np.float32), dtype=np.float32)
    bounds = bounds / bounds[-1]
    first = max(n_layer + 1 - n_gpu_layers, 0)
    n_act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < first or il - first >= n_act:
            out.append(cpu)
        else:
            at = np.float32(il - first) / np.float32(n_act)
            out.append(devices[int(np.searchsorted(bounds, at, side="right"))])
    return out


def _free_memory(device, cpu) -> float:
    free, total = device.memory()
    # a device that reports no memory counts the host's (as llama.cpp, its #18577)
    return float(free if free or total else cpu.memory()[0])


class LoadedModel:
    def __init__(self, model_path: str, *, n_threads: int = 0, n_gpu_layers: int = 0, n_parallel: int = 1,
                 chat_template: str | None = None, mmproj: str | None = None,
                 rpc: tuple[str, ...] = (), tensor_split: tuple[float, ...] = (),
                 use_mmap: bool = True, mlock: bool = False, cpu_kernels: bool = True,
                 adapters: AdapterConfig | None = None):
        self.path = os.fspath(model_path)
        self.gguf = GGUFFile(self.path)
        meta = self.gguf.metadata
        arch = self.gguf.architecture
        cls = model_class(arch, self.path)
        self.name = meta.get("general.name") or os.path.splitext(os.path.basename(self.path))[0]
        self.tokenizer = Tokenizer.from_metadata(meta)
        # the tokenizer's native tables hold the merges now, and its TokenTexts the texts: their
        # Python strings go (12.6 and 12.9 MiB for Qwen's 151k merges and tokens; Ollama's verbose
        # /api/show reads the file's header again)
        self.tokenizer.vocab.merges = []
        meta.pop("tokenizer.ggml.merges", None)
        meta.pop("tokenizer.ggml.tokens", None)
        self._chat_template_override = chat_template

        n_layer = meta.get(f"{arch}.block_count", 0)
        # graph size: ~60 nodes per layer plus 6 per attention call (at most one per sequence)
        max_nodes = max(16384, n_layer * (64 + 6 * n_parallel) + 4096)
        # and per LoRA adapter in use up to 7 adapted matrices a layer, ~24 nodes each (two planned products)
        max_nodes += len(adapters.lora) * n_layer * 7 * 24 if adapters else 0
        self.backend = ggml.Backend(n_threads=default_threads(n_threads), max_nodes=max_nodes, rpc=rpc)
        # cpu_kernels False: ggml's kernels for every product, to measure what ggserve's own give
        # (native/kernels/matmul.c; the same bits either way)
        self.backend.cpu_kernels = self.backend.cpu_kernels and cpu_kernels
        layer_devices = assign_layers(n_layer, n_gpu_layers, self.backend.gpus, self.backend.cpu, tensor_split)
        self.device_of_layer = layer_devices.__getitem__
        matmul_names = matmul_weight_names(self.gguf.tensors)
        self.weights = self.backend.load_weights(self.gguf, self._tensor_placement(layer_devices),
                                                 repack=matmul_names, use_mmap=use_mmap)
        if mlock:
            for buf in self.weights.values():
                try:
                    buf.lock()
                except OSError as e:     # as llama.cpp: a warning, the model still serves
                    log.warning("--mlock: %s: %s (raise the memlock limit: ulimit -l)", self.path, e.strerror)
        if not layer_devices[n_layer].is_cpu:
            self._duplicate_tied_output(layer_devices[n_layer])
        tensors = {}
        for buf in self.weights.values():
            tensors.update(buf.tensors)
        self.kernel_of = self._kernel_kinds(matmul_names)
        self.model = cls(meta, tensors, self.path)
        # LoRA adapters and control vectors (--lora, --control-vector): checked against the weights
        self.adapters = load_adapters(adapters, self.backend, self.weights, arch, self.model.n_embd, n_layer)
        self.kernel_of.update(self.adapters.kernel_kinds())
        # the mmproj's encoders on a backend of their own: chunks encode on a worker thread beside
        # text steps; an image row carries what the text model's input rows hold (Qwen3-VL: the
        # embedding plus one slice per deepstack layer)
        self.media = None if mmproj is None else MediaModels.load(
            mmproj, self.backend.n_threads, getattr(self.model, "n_embd_inp", self.model.n_embd), self.path)
        self.vision = self.media.vision if self.media else None
        self.audio = self.media.audio if self.media else None

    @functools.cached_property
    def chat_template(self):
        """The model's chat template (or the override given at construction)."""
        from ggserve.models.chat_template import ChatTemplate

        override = self._chat_template_override
        if override is not None:
            tok = self.tokenizer
            return ChatTemplate(override, bos_token=tok.id_to_token(tok.bos_id) if tok.bos_id >= 0 else "",
                                eos_token=tok.id_to_token(tok.eos_id) if tok.eos_id >= 0 else "",
                                add_bos=tok.vocab.add_bos)
        return ChatTemplate.from_metadata(self.gguf.metadata, add_bos=self.tokenizer.vocab.add_bos,
                                          tokens=self.tokenizer.vocab.tokens)

    def _kernel_kinds(self, matmul_names) -> dict:
        """Weights whose CPU kernel depends on the row count of the call
        (server/engine/kernel_parity.py): repacked ones, k-quants, and tinyBLAS's types."""
        kernel_of = {}
        for key, buf in self.weights.items():
            if not buf.device.is_cpu:
                continue
            for name, t in buf.tensors.items():
                if key == "CPU_REPACK":
                    kernel_of[t] = "repack"
                elif name in matmul_names and ggml.type_name(t.type) in TILED_TYPES:
                    kernel_of[t] = "tiled"
                elif name in matmul_names and ggml.type_name(t.type) in SGEMM_TYPES:
                    kernel_of[t] = "sgemm"
        return kernel_of

    def _tensor_placement(self, layer_devices):
        """Blocks on their layer's device, the output layer on the device of layer
        n_layer; token embeddings stay on the CPU (as in llama.cpp)."""
        place = {}
        for name in self.gguf.tensors:
            if name.startswith("blk."):
                place[name] = layer_devices[int(name.split(".")[1])]
            elif name.startswith("output"):
                place[name] = layer_devices[-1]
        return place

    def _duplicate_tied_output(self, device):
        """A model whose output matrix is its token embeddings (tied) gets a copy of
        them on `device` as "output.weight", as llama.cpp duplicates them: the
        embeddings stay on the CPU for their row lookups while the vocabulary-sized
        output product runs where the layers run."""
        if "output.weight" in self.gguf.tensors or "token_embd.weight" not in self.gguf.tensors:
            return
        embd = next(b.tensors["token_embd.weight"] for b in self.weights.values() if "token_embd.weight" in b)
        buf = self.backend.alloc(device, [("output.weight", embd.type, embd.ne)])
        buf["output.weight"].copy_from(embd)
        self.weights[f"{device.name} (tied output)"] = buf

    @property
    def remote(self) -> bool:
        return any(d.endpoint for d in self.backend.devices)

    def lost_worker(self) -> str | None:
        """When ggml lost an RPC worker (ggml.rpc_lost): which one, found by
        connecting to each (a lost worker refuses or does not answer)."""
        why = ggml.rpc_lost()
        if why is None:
            return None
        for endpoint in dict.fromkeys(d.endpoint for d in self.backend.devices if d.endpoint):
            try:
                socket.create_connection(ggml.split_endpoint(endpoint), timeout=1.0).close()
            except OSError as e:
                return f"RPC worker {endpoint} lost ({e.strerror or e})"
        return f"an RPC worker was lost ({why.strip()})"

    def survive_worker_loss(self) -> None:
        """From now on a lost RPC worker leaves the process running (lost_worker says
        so) instead of ending it; for a caller that watches and fails its requests."""
        ggml.rpc_exit_on_loss(False)

    def check_workers(self) -> None:
        for device in self.backend.devices:
            if device.endpoint:
                device.memory()

    def weight_bytes(self, device) -> int:
        n = sum(b.nbytes for b in self.weights.values() if b.device is device)
        if self.media is not None and device is self.backend.devices[0]:
            n += self.media.nbytes
        return n

    def memory_report(self, kv_bytes: dict[str, int]) -> str:
        """Weights, KV cache (kv_bytes by device name) and reserved compute per device."""
        lines = []
        for dev in self.backend.devices:
            c = self.backend.compute_bytes.get(dev.name, 0)
            if self.media is not None:
                c += self.media.backend.compute_bytes.get(dev.name, 0)
            lines.append(f"{dev.name} ({dev.description}): weights {self.weight_bytes(dev) / 2**20:.1f} MiB, "
                         f"KV cache {kv_bytes.get(dev.name, 0) / 2**20:.1f} MiB, compute {c / 2**20:.1f} MiB")
        if self.vision is not None:
            lines.append(f"vision ({self.vision.projector}): weights {self.vision.nbytes / 2**20:.1f} MiB "
                         f"(included above); compute reserved for its largest image")
        if self.audio is not None:
            lines.append(f"audio ({self.audio.projector}): weights {self.audio.nbytes / 2**20:.1f} MiB "
                         f"(included above); compute reserved for one chunk")
        return "\n".join(lines)

    def close(self) -> None:
        if self.media is not None:
            self.media.close()
        self.adapters.close()
        for b in self.weights.values():
            b.close()
        self.weights = {}
        self.backend.close()
