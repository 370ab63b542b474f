"""A router (server/router/) over real models, in this process on real uvicorn; each model
runs in its own `ggserve serve` child. Shared by tests/test_router.py and tests/test_ollama_api.py."""
from __future__ import annotations

import os
import time

import httpx
from server_harness import RunningServer

from ggserve.server.router.app import RouterConfig, create_router_app
from ggserve.server.router.catalog import scan_models_dir
from ggserve.server.router.registry import Registry

# small and quick children: one slot, a short context, one thread each (2 cores are shared)
CHILD_ARGS = ["-c", "512", "-np", "1", "-t", "1", "--no-webui"]


def models_dir(tmp, smollm2_path: str, gemma3_path: str, broken: bool = True) -> str:
    """smollm2.gguf and gemma3.gguf (links to the real files) and broken.gguf (not a GGUF file)."""
    d = tmp / "models"
    d.mkdir()
    os.symlink(smollm2_path, d / "smollm2.gguf")
    os.symlink(gemma3_path, d / "gemma3.gguf")
    if broken:
        (d / "broken.gguf").write_bytes(b"not a GGUF file at all")
    return str(d)


def router(path: str, models_max: int, child_args: tuple = (), **cfg) -> RunningServer:
    registry = Registry(scan_models_dir(path), CHILD_ARGS + list(child_args), models_max)
    app = create_router_app(RouterConfig(models_max=models_max, **cfg), registry, lambda: scan_models_dir(path))
    return RunningServer(app)


def statuses(url: str) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in httpx.get(url + "/models").json()["data"]}


def wait_status(url: str, model: str, want: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while statuses(url)[model] != want:
        assert time.monotonic() < deadline, f"{model} never became {want}: {statuses(url)}"
        time.sleep(0.05)


def children(pid: int | None = None) -> list[int]:
    """This process's `ggserve serve` child processes (the models'; not the grammar workers
    or other helpers that earlier tests of the same run left as children)."""
    pid = pid or os.getpid()
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) != pid:
                        continue
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if b"\0serve\0" in f.read():
                        out.append(int(p))
            except (OSError, IndexError, ValueError):
                pass
    return out


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")) / 1024
