"""The replica recipe of docs/deploy.md, run: Debian's nginx with deploy/nginx-ggserve.conf
in front of two ggserve replicas on loopback (skipped where nginx is not installed).

Three users take five turns each with their X-Session-Id: every turn after the first
finds >= 95% of its history in the prompt cache (it reached the replica holding the
conversation). Then the replica holding most users stops: their next turns are
answered by the other one (without cache the first time, with it after).
"""
import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import time

import httpx
import pytest

from ggserve.server.app import ServerConfig, create_app
from server_harness import RunningServer

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (scripts/install.sh installs it)")
CONF = pathlib.Path(__file__).parents[1] / "deploy" / "nginx-ggserve.conf"
USERS = ("ann-7f3a", "ben-19c2", "cy-a0e5")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def nginx(tmp: pathlib.Path, replicas: list[int]):
    """deploy/nginx-ggserve.conf with these replicas' ports, in a main config of our own
    (files under tmp; the access log records which replica served each session)."""
    port = free_port()
    site = CONF.read_text().replace("listen 8080;", f"listen 127.0.0.1:{port};")
    for default, p in zip(("127.0.0.1:8081", "127.0.0.1:8082"), replicas):
        site = site.replace(default, f"127.0.0.1:{p}")
    (tmp / "ggserve.conf").write_text(site)
    temp = " ".join(f"{k}_temp_path {tmp}/{k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (tmp / "nginx.conf").write_text(f"""
{"user root;" if os.geteuid() == 0 else ""}
worker_processes 1;
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 256; }}
http {{
    log_format upstream '$http_x_session_id|$upstream_addr|$upstream_status';
    access_log {tmp}/access.log upstream;
    {temp}
    include {tmp}/ggserve.conf;
}}
""")
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-g", "daemon off;"],
                            stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "nginx did not come up"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def served_by(tmp: pathlib.Path) -> dict[str, list[str]]:
    """session -> the replica that answered each of its requests, in order (nginx's access
    log; a retried request lists every replica tried, "A, B": B answered)."""
    out = {}
    for line in (tmp / "access.log").read_text().splitlines():
        session, upstream, _ = line.split("|")
        if session != "-":
            out.setdefault(session, []).append(upstream.split(", ")[-1])
    return out


def chat(url: str, session: str, messages: list) -> dict:
    r = httpx.post(url + "/v1/chat/completions", timeout=120, headers={"X-Session-Id": session},
                   json={"messages": messages, "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def turn(url, convs, history, user, n):
    convs[user].append({"role": "user", "content": f"This is {user}, question {n}: name a colour."})
    out = chat(url, user, convs[user])
    usage = out["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    before, history[user] = history[user], usage["prompt_tokens"] + usage["completion_tokens"]
    convs[user].append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
    return cached, before


def test_sessions_keep_their_replica_and_move_when_it_stops(smollm2_path, tmp_path):
    cfg = ServerConfig(model=smollm2_path, n_ctx=4096, n_parallel=4, n_threads=1, webui=False)
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(RunningServer(create_app(cfg))) for _ in range(2)]
        url = stack.enter_context(nginx(tmp_path, [r.port for r in replicas]))
        # each user's own system prompt: a replica that never saw the conversation caches ~nothing
        convs = {u: [{"role": "system", "content": f"You are the assistant of {u}. Answer in one word."}]
                 for u in USERS}
        history = dict.fromkeys(USERS, 0)
        for n in range(5):
            for user in USERS:
                cached, before = turn(url, convs, history, user, n)
                if n:
                    assert cached >= 0.95 * before, (user, n, cached, before)
        homes = {u: set(a) for u, a in served_by(tmp_path).items()}
        assert all(len(a) == 1 for a in homes.values()), homes     # affinity, seen by nginx

        # stop the replica that holds most users; their next turns go to the other one
        counts = {r: sum(f"127.0.0.1:{r.port}" in a for a in homes.values()) for r in replicas}
        gone = max(replicas, key=counts.get)
        moved = [u for u, a in homes.items() if f"127.0.0.1:{gone.port}" in a]
        gone.__exit__(None, None, None)
        for n in (5, 6):
            for user in moved:
                cached, before = turn(url, convs, history, user, n)
                if n == 6:       # the new replica holds the conversation from now on
                    assert cached >= 0.95 * before, (user, n, cached, before)
        after = served_by(tmp_path)
        assert moved and all(set(after[u][5:]) == {f"127.0.0.1:{r.port}"} for u in moved for r in replicas
                             if r is not gone)


def test_a_full_replica_429_is_retried_on_the_other(smollm2_path, tmp_path):
    # one slot and no queue: while a long request runs on replica A (sent to it directly),
    # A answers 429; nginx must retry those requests on B
    cfg = ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, max_queue=0, n_threads=1, webui=False)
    with contextlib.ExitStack() as stack:
        a, b = [stack.enter_context(RunningServer(create_app(cfg))) for _ in range(2)]
        url = stack.enter_context(nginx(tmp_path, [a.port, b.port]))
        body = {"messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0}
        with httpx.stream("POST", a.url + "/v1/chat/completions", timeout=120,
                          json={**body, "max_tokens": 400, "ignore_eos": True, "stream": True}) as long:
            lines = long.iter_lines()      # kept: a dropped generator closes the stream
            assert long.status_code == 200 and next(lines).startswith("data: ")
            assert httpx.post(a.url + "/v1/chat/completions", json=body).status_code == 429
            # 16 sessions: about half hash to A (all of them missing A: odds 2**-16)
            for i in range(16):
                r = httpx.post(url + "/v1/chat/completions", headers={"X-Session-Id": f"s{i}"}, timeout=120,
                               json={**body, "max_tokens": 1})
                assert r.status_code == 200, r.text
        log = (tmp_path / "access.log").read_text().splitlines()
        retried = [line for line in log if line.endswith(f"|127.0.0.1:{a.port}, 127.0.0.1:{b.port}|429, 200")]
        assert retried, "\n".join(log)
