"""Run a ggserve app on real uvicorn, on 127.0.0.1 and a free port, in a thread.

Shared by tests/test_server_*.py (not a test module itself).
"""
from __future__ import annotations

import re
import socket
import threading
import time

import httpx
import uvicorn


class RunningServer:
    def __init__(self, app, ready_timeout: float = 300.0, health_path: str = "/health"):
        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning",
                                                    lifespan="on"))
        self._thread = threading.Thread(target=self.server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)
        self._ready_timeout = ready_timeout
        self.health_path = health_path

    def __enter__(self) -> "RunningServer":
        self._thread.start()
        deadline = time.monotonic() + self._ready_timeout
        while time.monotonic() < deadline:
            if not self._thread.is_alive():
                raise RuntimeError("server thread died during start-up")
            try:
                r = httpx.get(self.url + self.health_path, timeout=2)
                if r.status_code == 200:
                    return self
                if r.status_code == 500:
                    raise RuntimeError(f"server failed to load: {r.text}")
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError("server did not become ready")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self._sock.close()

    def metric(self, name: str, headers: dict | None = None) -> float:
        """Value of an unlabelled sample in /metrics."""
        text = httpx.get(self.url + "/metrics", headers=headers or {}).text
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        if m is None:
            raise KeyError(name)
        return float(m.group(1))


def sse_events(response: httpx.Response) -> list:
    """Parse an SSE body into a list of JSON objects (and the string "[DONE]")."""
    import json

    out = []
    for block in response.text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), block
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
