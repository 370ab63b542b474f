"""Router mode's flags (llama-server 11434's) and `ggserve serve` as a router: with
--models-dir and/or --models-preset and no -m, each model is served by its own
`ggserve serve` child (server/router/), loaded on first use.

Every other flag on the command line goes to every model's child and wins over the
preset's sections (command line > model section > `[*]`)."""
from __future__ import annotations

import os
import sys

from ggserve.server.cli.serve_flags import _flag

# flags the router keeps for itself (with how many values follow each)
_ROUTER_ONLY = {"--models-dir": 1, "--models-preset": 1, "--models-max": 1, "--models-autoload": 0,
                "--no-models-autoload": 0, "--host": 1, "--port": 1, "--api-key": 1, "--api-key-file": 1,
                "-a": 1, "--alias": 1}


def add_router_flags(p) -> None:
    """Router mode: many models behind one server (docs/serving-many-models.md)."""
    _flag(p, "--models-dir", env="LLAMA_ARG_MODELS_DIR", metavar="PATH",
          help="router mode (without -m): serve the GGUF models of this folder, each loaded on first use "
               "(a file per model, or a folder per model with its mmproj / split files)")
    _flag(p, "--models-preset", env="LLAMA_ARG_MODELS_PRESET", metavar="PATH",
          help="router mode (without -m): an INI file of models and their flags, as llama-server's "
               "([*] for all; model =, load-on-startup, stop-timeout, any serve flag by name)")
    _flag(p, "--models-max", env="LLAMA_ARG_MODELS_MAX", type=int, default=4, metavar="N",
          help="router mode: models loaded at once; the least recently used idle one gives way "
               "(0: no limit)")
    _flag(p, "--models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD", flag=True, default=True,
          help="router mode: load a model when a request names it (default; ?autoload=0 per request)")
    p.add_argument("--no-models-autoload", dest="models_autoload", action="store_false",
                   help="router mode: only POST /models/load loads a model (?autoload=1 per request)")


def child_argv(argv: list[str]) -> list[str]:
    """The command line minus what the router keeps: what every model's child gets."""
    out, i = [], 0
    while i < len(argv):
        name = argv[i].split("=", 1)[0]
        if name in _ROUTER_ONLY:
            i += 1 + (_ROUTER_ONLY[name] if "=" not in argv[i] else 0)
            continue
        out.append(argv[i])
        i += 1
    return out


def router_catalog(args, table):
    """-> a function listing the models now (read again on GET /models?reload=1)."""
    from ggserve.server.router.catalog import hf_cache_dir, scan_cache, scan_models_dir
    from ggserve.server.router.presets import read_preset

    def specs():
        cache = hf_cache_dir()
        found = {s.id: s for s in scan_cache(cache)}
        if args.models_dir:
            found.update({s.id: s for s in scan_models_dir(args.models_dir)})
        if args.models_preset:
            preset, common, dedup_all = read_preset(args.models_preset, table, cache)
            for s in list(found.values()):
                s.args = common + s.args
            for s in preset:
                for cid in s.cache_ids if (s.dedup or dedup_all) else ():
                    if cid in found:
                        found[cid].hidden = True
                found[s.id] = s
        return list(found.values())
    return specs


def serve_router(args, argv: list[str], parser, log_kw: dict) -> int:
    import uvicorn

    from ggserve.server.cli.agent_flags import agent_settings, cors_origins
    from ggserve.server.cli.llama_flags import api_keys
    from ggserve.server.router.app import RouterConfig, create_router_app
    from ggserve.server.router.presets import PresetError, flag_table
    from ggserve.server.router.registry import Registry

    if args.models_max < 0:
        raise SystemExit("ggserve serve: --models-max must be >= 0 (0: no limit)")
    specs = router_catalog(args, flag_table(parser))
    try:
        first = specs()
    except (PresetError, ValueError) as e:
        raise SystemExit(f"ggserve serve: {e}")
    cfg = RouterConfig(models_max=args.models_max or sys.maxsize, autoload=args.models_autoload,
                       api_keys=api_keys(args),
                       cors_origins=cors_origins(args, agent_settings(args)),   # as a single model's server
                       max_body_bytes=int(args.max_body_mb * 2**20))
    app = create_router_app(cfg, Registry(first, child_argv(argv), cfg.models_max), specs)
    if not args.log_disable:
        print(f"ggserve: router over {len(first)} models on http://{args.host}:{args.port} "
              f"(--models-max {args.models_max}; GET /models lists them)", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=log_kw.get("log_level", "info"),
                **{k: v for k, v in log_kw.items() if k != "log_level"})
    return 0


def is_router(args) -> bool:
    if not (args.models_dir or args.models_preset):
        return False
    if args.model and os.environ.get("LLAMA_ARG_MODEL") != args.model:
        raise SystemExit("ggserve serve: -m serves one model; --models-dir / --models-preset serve many "
                         "(router mode): give one or the other")
    return not args.model
