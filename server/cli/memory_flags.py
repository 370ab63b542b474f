"""How much memory the KV cache may take: llama-server 11434's --swa-full, --fit,
--fit-target, --fit-ctx, --ctx-checkpoints and --checkpoint-min-step (common/arg.cpp), read into
EngineConfig's fields
(server/engine/memory/sizing.py does the sizing)."""
from __future__ import annotations

from ggserve.server.cli.serve_flags import _EnvDefault

_ON, _OFF = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def add_memory_flags(p) -> None:
    p.add_argument("--swa-full", action=_EnvDefault, env="LLAMA_ARG_SWA_FULL", nargs=0, default=False,
                   help="sliding-window layers keep a cache over the whole context, as global layers do "
                        "(default: a ring of window + ubatch cells per slot, llama.cpp's iSWA cache)")
    p.add_argument("-fit", "--fit", action=_EnvDefault, env="LLAMA_ARG_FIT", type=str.lower, choices=_ON + _OFF,
                   default="on", metavar="on|off",
                   help="with -c 0, shrink the context until weights and KV cache leave --fit-target MiB "
                        "of the host's memory free (on the CPU; the log says what was chosen)")
    p.add_argument("-fitt", "--fit-target", action=_EnvDefault, env="LLAMA_ARG_FIT_TARGET", type=int,
                   default=1024, metavar="MiB", help="memory --fit leaves free, in MiB")
    p.add_argument("-fitc", "--fit-ctx", action=_EnvDefault, env="LLAMA_ARG_FIT_CTX", type=int, default=4096,
                   metavar="N", help="the least context per slot --fit may leave")
    p.add_argument("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", action=_EnvDefault,
                   env="LLAMA_ARG_CTX_CHECKPOINTS", type=int, default=32, metavar="N",
                   help="context checkpoints kept per slot: states of a hybrid model's recurrent layers saved "
                        "on a prompt's way (at user turns and 4 tokens before its end), in host RAM, that a later "
                        "prompt continues from (0: none)")
    p.add_argument("-cms", "--checkpoint-min-step", action=_EnvDefault, env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
                   type=int, default=8192, metavar="N",
                   help="least spacing of context checkpoints in tokens: a user turn closer than this to the last "
                        "checkpoint gets none, and a full list drops those this close to an earlier one first "
                        "(0: no minimum)")


def memory_settings(args) -> dict:
    """EngineConfig fields of these flags; a bad value ends the program naming its flag."""
    if args.fit_target < 0:
        raise SystemExit("ggserve serve: --fit-target must be >= 0 (MiB)")
    if args.fit_ctx < 1:
        raise SystemExit("ggserve serve: --fit-ctx must be >= 1")
    if args.checkpoint_min_step < 0:
        raise SystemExit("ggserve serve: --checkpoint-min-step must be >= 0")
    return {"swa_full": bool(args.swa_full), "fit": args.fit in _ON, "fit_target_mb": args.fit_target,
            "fit_ctx": args.fit_ctx, "ctx_checkpoints": max(0, args.ctx_checkpoints),
            "checkpoint_min_step": args.checkpoint_min_step}
