"""What an engine is built from: one dataclass, made once from the command line's
flags (or a test's keywords). `ggserve serve`'s ServerConfig extends it with what
only the HTTP side reads, so an engine flag is one field here and one flag."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ggserve.server.engine.adapters import AdapterConfig
    from ggserve.server.engine.speculative.speculator import SpecConfig


@dataclass
class EngineConfig:
    model: str                                # the GGUF file
    n_ctx: int = 4096                         # -c: every slot's context together (0: the model's)
    n_batch: int = 512                        # -b: rows per step at most
    n_parallel: int = 4                       # -np: slots
    kv_unified: bool = False                  # -kvu: every slot may use the whole KV cache
    context_shift: bool = False               # --context-shift
    cache_type_k: str = "f16"                 # -ctk
    cache_type_v: str = "f16"                 # -ctv
    n_threads: int = 0                        # -t (0: one per physical core)
    n_threads_batch: int = -1                 # -tb (-1: as n_threads)
    use_mmap: bool = True                     # -lm: weights mapped from the file, or read into memory
    mlock: bool = False                       # -lm mlock / mmap+mlock: weights kept in RAM
    n_gpu_layers: int = 0                     # -ngl
    rpc: tuple[str, ...] = ()                 # --rpc: RPC workers' host:port (remote devices)
    tensor_split: tuple[float, ...] = ()      # -ts: layer shares of the devices
    chat_template: str | None = None          # --chat-template: a built-in template's name
    chat_template_file: str | None = None     # --chat-template-file (over the name and the GGUF's)
    mmproj: str | None = None                 # --mmproj: the vision projector
    image_cache_mb: int = 256                 # image embeddings kept by content
    max_stall_ms: float = -1.0                # how long prompts may hold back decodes (<0: auto, 0: off)
    kernel_parity: bool = True                # llama.cpp's kernel for every row (--no-kernel-parity)
    cpu_kernels: bool = True                  # ggserve's own CPU matmul kernels where they apply
    slot_prompt_similarity: float = 0.1       # --slot-prompt-similarity
    cache_ram_mb: int = 8192                  # --cache-ram: host-RAM prompt cache (0: off, -1: no limit)
    embeddings: bool = False                  # --embeddings: pooled hidden states instead of logits
    pooling: str | None = None                # --pooling (None: the GGUF's)
    spec: SpecConfig | None = None            # speculative decoding (None: none)
    swa_full: bool = False                    # --swa-full: sliding-window layers over the whole context
    fit: bool = False                         # --fit: an unset context shrinks to leave fit_target_mb free
    fit_target_mb: int = 1024                 # --fit-target
    fit_ctx: int = 4096                       # --fit-ctx: the least context per slot --fit leaves
    ctx_checkpoints: int = 32                 # --ctx-checkpoints: saved recurrent states per slot (0: none)
    checkpoint_min_step: int = 8192           # --checkpoint-min-step: least spacing of checkpoints (0: none)
    adapters: AdapterConfig | None = None     # --lora, --control-vector and their kin (None: none)

    @property
    def checkpoints(self) -> tuple[int, int]:
        """(--ctx-checkpoints, --checkpoint-min-step), as memory/recurrent_state.py's Checkpoints."""
        return self.ctx_checkpoints, self.checkpoint_min_step

    def template_source(self) -> str | None:
        """The chat template's text that replaces the GGUF's, if a flag names one."""
        if self.chat_template_file:
            with open(self.chat_template_file, encoding="utf-8") as f:
                return f.read()
        if self.chat_template:
            from ggserve.models.builtin_templates import BUILTIN
            return BUILTIN[self.chat_template]
        return None
