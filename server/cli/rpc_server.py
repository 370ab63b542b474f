"""`ggserve rpc-server`: serve this machine's ggml devices to `ggserve serve --rpc`
(or llama.cpp's `llama-server --rpc`) over ggml's RPC protocol, as llama.cpp's
rpc-server does: the same ggml, the same protocol, so either side can be
llama.cpp's. It computes whatever graphs its one client sends; the protocol has
no authentication and no encryption.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

log = logging.getLogger("ggserve.rpc")

WARNING = ("the RPC protocol has no authentication and no encryption: anyone who can "
           "connect to this port can run computations and read and write memory on this "
           "machine's devices. Bind to 127.0.0.1 (the default) or a trusted private network "
           "only, never to the internet.")


def parser() -> argparse.ArgumentParser:
    from ggserve.native import ggml

    p = argparse.ArgumentParser(
        prog="ggserve rpc-server", allow_abbrev=False,
        description="Serve this machine's ggml devices (its GPUs, else its CPU) to one "
                    "`ggserve serve --rpc HOST:PORT` (or llama.cpp) client at a time.",
        epilog=f"WARNING: {WARNING}")
    p.add_argument("-H", "--host", default="127.0.0.1",
                   help="address to bind (default: 127.0.0.1; anything else exposes the "
                        "unauthenticated protocol, see the warning below)")
    p.add_argument("-p", "--port", type=int, default=ggml.RPC_PORT, help=f"port (default: {ggml.RPC_PORT})")
    p.add_argument("-t", "--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2), metavar="N",
                   help="CPU threads for the CPU device (default: half the cores, as llama.cpp's rpc-server)")
    p.add_argument("-d", "--device", metavar="DEV1,DEV2", help="comma-separated ggml devices to serve "
                   f"(default: every GPU, else the CPU; here: {[d['name'] for d in ggml.list_devices()]})")
    p.add_argument("-c", "--cache", action="store_true",
                   help="keep tensors the client sends in a local file cache, so a restarted client "
                        "sends only hashes of large weights (--cache-dir)")
    p.add_argument("--cache-dir", metavar="DIR",
                   default=os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                        "ggserve", "rpc"),
                   help="folder of the --cache (default: %(default)s)")
    return p


def main(argv: list[str]) -> int:
    from ggserve.native import ggml

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads < 1 or not 0 < args.port < 65536:
        raise SystemExit("ggserve rpc-server: --threads must be >= 1 and --port in 1..65535")
    cache = None
    if args.cache:
        os.makedirs(args.cache_dir, exist_ok=True)
        cache = args.cache_dir
    loud = args.host not in ("127.0.0.1", "localhost", "::1")
    log.warning("%s%s", "!!! " if loud else "", WARNING)
    endpoint = f"{args.host}:{args.port}"      # ggml parses HOST:PORT at the first colon: no IPv6
    devices = [d for d in (args.device or "").split(",") if d] or None
    log.info("serving ggml devices at %s (%d threads, cache %s)", endpoint, args.threads, cache or "off")
    failed = []

    def run():
        try:
            ggml.rpc_start_server(endpoint, devices, args.threads, cache)
        except Exception as e:        # unknown device, RPC missing from this ggml
            failed.append(e)

    # ggml's server loop never returns while it serves; the main thread stays free for signals
    t = threading.Thread(target=run, name="ggml-rpc-server", daemon=True)
    t.start()
    try:
        while t.is_alive():
            t.join(0.5)
    except KeyboardInterrupt:
        return 0
    print(f"ggserve rpc-server: {failed[0] if failed else f'cannot serve at {endpoint} (see above)'}",
          file=sys.stderr)
    return 1
