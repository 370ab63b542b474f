"""How much memory the KV cache gets before any is allocated: the layers' specs as
the flags want them (`--swa-full`), and the context `--fit` leaves room for.

`--fit on` (llama-server 11434's default, common/fit.cpp common_params_fit_impl): on a
machine without the memory for the model's whole context, an unset context (`-c 0`)
shrinks until weights and KV cache leave `--fit-target` MiB of the host's memory
free, never below `--fit-ctx` tokens per slot. llama.cpp interpolates linearly between
the memory at the smallest and the largest context (KV grows linearly in the context,
a sliding-window ring does not grow past its window) and rounds down to 256 cells per
slot; so does this. ggserve fits on the host's memory only (weights on a GPU: no fit).
"""
from __future__ import annotations

import dataclasses
import logging
import os

from ggserve.models.memory import LayerKV
from ggserve.native import ggml
from ggserve.server.engine.memory.model_memory import context_sizes, ring_layout

log = logging.getLogger("ggserve.engine")
MiB = 2**20


def layer_specs(model, device_of_layer, swa_full: bool) -> list:
    """The model's memory specs; with swa_full, sliding-window layers keep a full-size
    cache (llama.cpp's --swa-full) instead of the window + ubatch ring."""
    specs = model.memory_layers(device_of_layer)
    if not swa_full:
        return specs
    return [dataclasses.replace(s, window_cache=False) if isinstance(s, LayerKV) else s for s in specs]


def kv_bytes(specs: list, n_cells: int, n_seqs: int, n_ubatch: int, unified: bool, type_k: int, type_v: int) -> int:
    """Bytes of K/V the cache of n_cells (n_seqs slots) allocates for these specs, as
    model_memory.Memory lays it out (window_cache layers in their ring)."""
    kv = [s for s in specs if isinstance(s, LayerKV) and s.kv_from < 0]
    per_ring, rings = ring_layout(kv, n_cells, n_seqs, n_ubatch, unified) if any(s.window_cache for s in kv) else (0, 0)

    def row(s):
        return ggml.row_size(type_k, s.n_embd_k) + (0 if s.v_in_k else ggml.row_size(type_v, s.n_embd_v))
    return sum(row(s) * (per_ring * rings if s.window_cache else n_cells) for s in kv)


def host_memory() -> int:
    """The host's physical memory, what llama.cpp's CPU device reports to --fit as its total."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fit_context(cfg, lm, specs: list, n_ctx_train: int, total: int | None = None) -> tuple[int, int]:
    """(KV cells, context per slot): context_sizes of the flags, or with cfg.fit and an
    unset context on the host, the largest that leaves cfg.fit_target_mb free."""
    sizes = context_sizes(cfg.n_ctx, cfg.n_parallel, cfg.kv_unified, n_ctx_train)
    if not cfg.fit or cfg.n_ctx or cfg.n_gpu_layers or cfg.rpc:
        return sizes
    type_k, type_v = ggml.type_by_name(cfg.cache_type_k), ggml.type_by_name(cfg.cache_type_v)
    n_streams = 1 if cfg.kv_unified else cfg.n_parallel
    n_max, n_min = sizes[0], min(sizes[0], cfg.fit_ctx * n_streams)
    weights = sum(lm.weight_bytes(d) for d in lm.backend.devices)

    def used(n):
        return weights + kv_bytes(specs, n, cfg.n_parallel, cfg.n_batch, cfg.kv_unified, type_k, type_v)
    total = host_memory() if total is None else total
    target = total - cfg.fit_target_mb * MiB
    if used(n_max) <= target or n_max <= n_min:
        return sizes
    n = n_min
    if target > used(n_min):        # llama.cpp's linear interpolation, rounded down to 256 per stream
        n += (n_max - n_min) * (target - used(n_min)) // (used(n_max) - used(n_min))
        n = max(n - n % (256 * n_streams), n_min)
    log.info("--fit: context size reduced from %d to %d -> %d MiB less memory in total "
             "(%d MiB of %d MiB used, --fit-target %d MiB free)", n_max, n, (used(n_max) - used(n)) // MiB,
             used(n) // MiB, total // MiB, cfg.fit_target_mb)
    return context_sizes(n, cfg.n_parallel, cfg.kv_unified, n_ctx_train)
