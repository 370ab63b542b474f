"""llama-server flags that `ggserve serve` takes as llama-server does, or accepts because they change nothing here.

Taken: the sampling flags (--temp, --top-k, ...: server/cli/sampling_flags.py), -s/--seed and -n/--n-predict
(every request's default, as llama-server's sampling defaults),
--no-ui (= --no-webui). Accepted with no effect, each for the reason in its help: --offline,
--no-jinja, -cb/--cont-batching, -ub/--ubatch-size, -fa/--flash-attn, --[no-]cache-idle-slots.
--host may list several addresses (`127.0.0.1,::1`), as llama-server 11434; see bind_sockets.
"""
from __future__ import annotations

import argparse
import socket

from ggserve.server.api.prefix import normalized as normalized_prefix
from ggserve.server.cli.log_flags import add_log_flags
from ggserve.server.cli.sampling_flags import (
    add_sampling_flags,
    check_sampling_flags,
    default_grammar,
    sampling_flag_defaults,
)

_SEED_RANDOM = 0xFFFFFFFF       # llama.cpp's LLAMA_DEFAULT_SEED: a random seed per request


LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
_ON, _OFF, _AUTO = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0"), ("auto", "-1")

# llama-server flags for what ggserve does not do: refused by name (not "unrecognized arguments")
_REFUSED = {"--media-path": (1, "file:// media are not read"),
            "--grp-attn-n": (1, "self-extend is not supported"),
            "--grp-attn-w": (1, "self-extend is not supported")}


class FlagParser(argparse.ArgumentParser):
    """Flags read as llama.cpp reads them: a value never sticks to a short flag (`-cl` is a flag
    of its own, not `-c l`; `-mmdev` not `-m mdev`), and a flag this server does not know is
    refused by its own name."""

    def _get_option_tuples(self, option_string):
        if len(option_string) > 2 and option_string[0] in self.prefix_chars \
                and option_string[1] not in self.prefix_chars:
            return []
        return super()._get_option_tuples(option_string)

    def parse_args(self, args=None, namespace=None):
        namespace, extra = self.parse_known_args(args, namespace)
        flags = [a for a in extra if a.startswith("-") and len(a) > 1]
        if flags:
            self.error(f"{flags[0].split('=')[0]} is not supported by ggserve serve (see --help)")
        if extra:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return namespace


class _Refuse(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is not supported: {_REFUSED[option_string][1]}")


class _Accepted(argparse.Action):
    """A llama-server flag that changes nothing here (its help says why)."""

    def __call__(self, parser, namespace, values, option_string=None):
        pass


def add_llama_flags(p) -> None:
    # --help lists the flags in the order they are added
    _add_refused_flags(p)
    _add_serving_mode_flags(p)
    add_sampling_flags(p)
    add_log_flags(p)
    _add_request_default_flags(p)
    _add_client_facing_flags(p)
    _add_engine_compat_flags(p)
    _add_load_mode_flags(p)
    _add_api_and_request_flags(p)
    _add_runtime_compat_flags(p)


def _add_refused_flags(p) -> None:
    """llama-server features ggserve lacks: hidden from --help, refused by name with the reason."""
    for flag, (n, why) in _REFUSED.items():
        p.add_argument(flag, nargs=n, action=_Refuse, help=argparse.SUPPRESS,
                       dest=f"_refused{flag.replace('-', '_')}")


def _add_serving_mode_flags(p) -> None:
    """What is served and when: reranking, sleeping while idle, thinking."""
    p.add_argument("--reranking", "--rerank", action="store_true",
                   help="serve /rerank (also /reranking, /v1/rerank, /v1/reranking): --embeddings with "
                        "--pooling rank, as llama-server")
    p.add_argument("--sleep-idle-seconds", type=int, default=-1, metavar="SECONDS",
                   help="free the model after this many seconds without requests; the next request "
                        "that needs it loads it again (default: -1, never)")
    p.add_argument("-rea", "--reasoning", type=str.lower, choices=_ON + _OFF + _AUTO, default="auto",
                   metavar="on|off|auto", help="thinking: on/off sets the template's enable_thinking for "
                   "every request (a request's chat_template_kwargs win); auto: as the template does")


def _add_request_default_flags(p) -> None:
    """The seed and length of requests that give none."""
    p.add_argument("-s", "--seed", type=int, default=None, metavar="SEED",
                   help="default seed of requests that give none (-1: random, the default)")
    p.add_argument("-n", "--n-predict", "--predict", type=int, default=-1, metavar="N", dest="n_predict",
                   help="default number of tokens to generate for requests that give none (-1: until the context)")


def _add_client_facing_flags(p) -> None:
    """What clients see: the model's tags in /v1/models, the chat page (--no-ui)."""
    p.add_argument("--tags", default="", metavar="STRING",
                   help="model tags, comma-separated, shown in /v1/models (informational)")
    p.add_argument("--no-ui", action="store_true", dest="no_webui", default=argparse.SUPPRESS,
                   help="same as --no-webui (llama-server's spelling)")


def _add_engine_compat_flags(p) -> None:
    """Flags for how llama-server loads, batches, attends, samples and caches that change
    nothing here (each help says why)."""
    p.add_argument("--offline", action="store_true",
                   help="accepted for llama-server compatibility: ggserve never downloads models")
    p.add_argument("--no-jinja", action="store_true",
                   help="accepted for llama-server compatibility: templates are always rendered with Jinja")
    p.add_argument("-cb", "--cont-batching", action="store_true",
                   help="accepted for llama-server compatibility: batching is always continuous")
    p.add_argument("-ub", "--ubatch-size", type=int, default=None, metavar="N",
                   help="accepted for llama-server compatibility: ggserve has no separate physical batch")
    p.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default=None,
                   help="accepted for llama-server compatibility: attention is computed as the CPU "
                        "build of llama.cpp 11434 computes it by default")
    p.add_argument("-bs", "--backend-sampling", action="store_true",
                   help="accepted for llama-server compatibility: sampling always runs on the CPU, "
                        "which llama.cpp's backend sampling matches")
    p.add_argument("--cache-idle-slots", "--no-cache-idle-slots", nargs=0, action=_Accepted,
                   help="accepted for llama-server compatibility: an idle slot's prompt goes to the host-RAM "
                        "cache when a running sequence needs its KV cells (with --cache-ram), never before")


def _add_load_mode_flags(p) -> None:
    """How the weights are loaded: memory-mapped, read, locked in RAM."""
    p.add_argument("-lm", "--load-mode", choices=LOAD_MODES, default="auto", metavar="MODE",
                   help="how the weights are loaded, as llama-server's: auto or mmap: memory-mapped from the "
                        "file; none or dio: read into memory; mlock: read and kept in RAM; mmap+mlock: "
                        "mapped and kept in RAM (where the system refuses to lock them: a warning)")
    p.add_argument("--mlock", action="store_true",
                   help="kept in RAM (earlier llama-server's spelling of --load-mode mmap+mlock)")
    p.add_argument("--mmap", action=argparse.BooleanOptionalAction, default=None,
                   help="--no-mmap: read into memory (earlier llama-server's spelling of --load-mode none)")


def _add_api_and_request_flags(p) -> None:
    """The API's path prefix and key file; --keep and --ignore-eos, defaults of requests."""
    p.add_argument("--api-prefix", default="", metavar="PREFIX",
                   help="serve every endpoint and the chat page under this path (/llama: /llama/v1/models), "
                        "as llama-server, for a reverse proxy that forwards the prefix")
    p.add_argument("--keep", type=int, default=0, metavar="N",
                   help="prompt tokens a context shift keeps after the BOS, for requests that give no n_keep "
                        "(default: 0, -1: the whole prompt), as llama-server")
    p.add_argument("--ignore-eos", action="store_true",
                   help="requests that leave ignore_eos out ignore the end of generation (and generate "
                        "up to their limit), as llama-server")
    p.add_argument("--api-key-file", metavar="FNAME",
                   help="API keys, one per line (a line starting with # is a comment), as llama-server; "
                        "with --api-key, the keys of both are accepted")


def _add_runtime_compat_flags(p) -> None:
    """More flags that change nothing here: warm-up, HTTP threads, timings, escapes."""
    p.add_argument("--warmup", "--no-warmup", nargs=0, action=_Accepted,
                   help="accepted for llama-server compatibility: ggserve runs no warm-up decode at start")
    p.add_argument("--threads-http", type=int, default=None, metavar="N",
                   help="accepted for llama-server compatibility: one event loop serves HTTP")
    p.add_argument("--perf", "--no-perf", nargs=0, action=_Accepted,
                   help="accepted for llama-server compatibility: responses always carry their timings")
    p.add_argument("-e", "--escape", "--no-escape", nargs=0, action=_Accepted,
                   help="accepted for llama-server compatibility: escapes are for prompts on a command line")



def llama_argv(argv: list[str]) -> list[str]:
    """llama.cpp's common/arg.cpp reads `_` as `-` in long flags (--backend_sampling)."""
    def fix(a: str) -> str:
        if not a.startswith("--"):
            return a
        name, eq, value = a.partition("=")
        return name.replace("_", "-") + eq + value
    return [fix(a) for a in argv]


def check_llama_flags(args) -> None:
    check_sampling_flags(args)
    if args.seed is not None and args.seed < -1:
        raise SystemExit("ggserve serve: --seed must be >= 0, or -1 (random)")
    if args.sleep_idle_seconds == 0 or args.sleep_idle_seconds < -1:
        raise SystemExit("ggserve serve: --sleep-idle-seconds must be >= 1, or -1 (never sleep)")
    if args.keep < -1:
        raise SystemExit("ggserve serve: --keep must be >= 0, or -1 (the whole prompt)")
    if args.n_predict < -1:
        raise SystemExit("ggserve serve: --n-predict must be >= 0, or -1 (until the context)")


def api_keys(args) -> list[str]:
    """--api-key (comma-separated) and the lines of --api-key-file, as llama-server reads them."""
    keys = [k.strip() for k in (args.api_key or "").split(",") if k.strip()]
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                keys += [line.rstrip("\r\n") for line in f if line.strip() and not line.startswith("#")]
        except OSError as e:
            raise SystemExit(f"ggserve serve: --api-key-file: cannot read {args.api_key_file}: {e.strerror}")
    return keys


def tags(args) -> tuple[str, ...]:
    return tuple(sorted({t.strip() for t in args.tags.split(",") if t.strip()}))


def reasoning_kwargs(args) -> dict:
    """--reasoning as llama-server: on/off set enable_thinking in the default template kwargs."""
    if args.reasoning in _ON:
        return {"enable_thinking": True}
    return {"enable_thinking": False} if args.reasoning in _OFF else {}


def llama_flag_settings(args) -> dict:
    """ServerConfig fields these flags set. --reranking is --embeddings with --pooling rank
    (llama-server's common/arg.cpp); dio (direct I/O "if available") reads as none does."""
    use_mmap = args.load_mode in ("auto", "mmap", "mmap+mlock") and args.mmap is not False
    return {"ignore_eos": args.ignore_eos, "n_keep": args.keep, "api_prefix": normalized_prefix(args.api_prefix),
            "default_grammar": default_grammar(args),
            "use_mmap": use_mmap, "mlock": args.mlock or args.load_mode in ("mlock", "mmap+mlock"),
            "embeddings": bool(args.embeddings or args.reranking),
            "pooling": "rank" if args.reranking else args.pooling,
            "sleep_idle_seconds": args.sleep_idle_seconds}


def sampling_defaults(args) -> dict:
    """SamplingParams fields a request that leaves them out takes from the command line."""
    out = sampling_flag_defaults(args)
    if args.seed is not None and args.seed not in (-1, _SEED_RANDOM):
        out["seed"] = args.seed
    return out


def bind_sockets(host: str, port: int) -> list[socket.socket]:
    """Listening sockets for each address in a comma-separated --host (IPv6 ones only IPv6)."""
    socks = []
    try:
        for h in (x.strip() for x in host.split(",") if x.strip()):
            fam = socket.AF_INET6 if ":" in h else socket.AF_INET
            s = socket.socket(fam, socket.SOCK_STREAM)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if fam == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((h, port))
            s.listen(2048)
            s.set_inheritable(True)
    except OSError as e:
        for s in socks:
            s.close()
        raise SystemExit(f"ggserve serve: --host {host}: cannot listen on port {port}: {e}")
    return socks
