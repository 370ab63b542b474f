"""bench/serve.py, the benchmark harness: its statistics and table offline, and one small
end-to-end run against a real ggserve (SmolLM2, 2 requests, concurrency 1)."""
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(ROOT, "bench", "serve.py")


def _load_serve():
    spec = importlib.util.spec_from_file_location("ggserve_bench_serve", SERVE)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


serve = _load_serve()

CELL_FIELDS = {
    "server", "workload", "concurrency", "rounds", "requests", "errors", "first_error",
    "wall_s", "output_tokens", "prompt_tokens", "cached_tokens", "full_length",
    "output_tps", "output_tps_rounds", "requests_per_s", "prompt_tps",
    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "itl_max_ms",
    "e2e_p50_ms", "e2e_max_ms", "decode_tps_p50", "peak_rss_mb", "load_avg_1m",
}


# ------------------------------------------------------------------ offline parts

def test_percentile_matches_numpy():
    np = pytest.importorskip("numpy")
    xs = [5.0, 1.0, 3.0, 9.0, 2.5, 7.0]
    for q in (0, 1, 50, 90, 99, 100):
        assert serve.common.percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    assert math.isnan(serve.common.percentile([], 50))
    assert serve.common.percentile([4.0], 99) == 4.0


def _fake_cell(server, tps_scale=1.0):
    cell = serve.Cell(server, "text", 4)
    for i in range(4):
        cell.results.append(serve.Result(ok=True, ttft=0.1 * (i + 1), e2e=1.0 + 0.1 * i,
                                         gaps=[0.02, 0.03, 0.05], prompt_tokens=100,
                                         completion_tokens=4, cached_tokens=10))
    cell.results.append(serve.Result(error="HTTP 500: boom"))
    cell.walls = [2.0 / tps_scale]
    cell.round_tps = [8.0 * tps_scale]
    cell.peak_rss_mb = 200.0
    return cell


def test_summarize_ratios_and_table(capsys):
    g = serve.summarize(_fake_cell(serve.GG, 2.0), max_tokens=4)
    ll = serve.summarize(_fake_cell(serve.LL, 1.0), max_tokens=4)
    assert set(g) == CELL_FIELDS
    assert g["requests"] == 4 and g["errors"] == 1 and g["first_error"] == "HTTP 500: boom"
    assert g["output_tokens"] == 16 and g["output_tps"] == pytest.approx(16.0)
    assert g["requests_per_s"] == pytest.approx(4.0)
    assert g["prompt_tps"] == pytest.approx(400 / 1.0)          # 400 prompt tokens over 1 s of TTFT
    assert g["ttft_p50_ms"] == pytest.approx(250.0)
    assert g["itl_max_ms"] == pytest.approx(50.0)
    assert g["full_length"] is True
    rows = serve.ratios([g, ll])
    assert len(rows) == 1 and rows[0]["output_tps"] == pytest.approx(2.0)
    assert rows[0]["ttft_p50_ms"] == pytest.approx(1.0)
    serve.print_table([g, ll], rows)
    out = capsys.readouterr().out
    assert "ggserve/llama" in out and "2.00x" in out and "(1 err)" in out


def test_prompts_are_deterministic_and_unique():
    a = serve.make_messages("text", 0, 1, 6, None)
    assert a == serve.make_messages("text", 0, 1, 6, None)
    assert len({json.dumps(m) for m in a}) == 6
    assert len({len(m[0]["content"]) // 100 for m in a}) == 3          # three lengths
    assert serve.make_messages("text", 1, 1, 1, None) != a[:1]       # rounds do not share prompts
    assert serve.make_messages("text", 0, 4, 1, None) != a[:1]       # nor concurrency levels
    p = serve.make_messages("prefix", 0, 1, 3, None)
    assert len({m[0]["content"] for m in p}) == 1                   # one shared system prompt
    assert len({m[1]["content"] for m in p}) == 3


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    recs = []
    for srv in (serve.GG, serve.LL):
        for c in (1, 4):
            r = serve.summarize(_fake_cell(srv), max_tokens=4)
            r["concurrency"] = c
            recs.append(r)
    out = tmp_path / "p.png"
    serve.plot(recs, str(out), "test")
    assert out.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------ end to end

def _run_harness(tmp_path, *extra, timeout=240):
    out = tmp_path / "serve.json"
    cmd = [sys.executable, SERVE, "--requests", "2", "--rounds", "1", "--concurrency", "1",
           "--max-tokens", "6", "--workloads", "text", "--ctx", "1024", "--threads", "1",
           "--out", str(out), "--log-dir", str(tmp_path / "logs"), *extra]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    return p, out


def test_harness_against_ggserve(tmp_path, smollm2_path):
    png = tmp_path / "serve.png"
    p, out = _run_harness(tmp_path, "--model", smollm2_path,
                          *(["--plot", str(png)] if importlib.util.find_spec("matplotlib") else []))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["schema"] == "ggserve-bench/1" and doc["bench"] == "serve"
    assert {"created", "env", "config", "results", "servers", "ratios", "skipped", "total_s"} <= set(doc)
    assert doc["env"]["cpus"] >= 1 and doc["env"]["llama_server"] is None
    assert doc["ratios"] == [] and doc["skipped"] == []
    srv = doc["servers"]["ggserve"]
    assert srv["load_s"] > 0 and srv["peak_rss_mb"] > 10
    assert srv["argv"][srv["argv"].index("-t") + 1] == "1"           # settings reach the server

    [r] = doc["results"]
    assert set(r) == CELL_FIELDS
    assert (r["server"], r["workload"], r["concurrency"], r["rounds"]) == ("ggserve", "text", 1, 1)
    assert r["requests"] == 2 and r["errors"] == 0 and r["first_error"] is None
    assert r["output_tokens"] == 12 and r["full_length"] is True     # ignore_eos honoured
    assert r["prompt_tokens"] > 2 * 20
    for k in ("wall_s", "output_tps", "requests_per_s", "prompt_tps", "ttft_p50_ms", "ttft_p99_ms",
              "itl_p50_ms", "itl_p99_ms", "itl_max_ms", "e2e_p50_ms", "e2e_max_ms",
              "decode_tps_p50", "peak_rss_mb"):
        assert isinstance(r[k], (int, float)) and r[k] > 0, (k, r[k])
    assert r["ttft_p50_ms"] <= r["ttft_p99_ms"] < r["e2e_max_ms"] <= r["wall_s"] * 1000
    assert r["itl_p50_ms"] <= r["itl_p99_ms"] <= r["itl_max_ms"] < r["e2e_max_ms"]
    assert r["output_tps"] == pytest.approx(r["output_tokens"] / r["wall_s"])
    assert r["requests_per_s"] == pytest.approx(2 / r["wall_s"])
    assert 10 < r["peak_rss_mb"] < 64 * 1024
    if png.exists() or "--plot" in p.args:
        assert png.read_bytes()[:4] == b"\x89PNG"
    assert "ggserve" in p.stdout and "out tok/s" in p.stdout


def test_harness_stops_server_on_interrupt(tmp_path, smollm2_path):
    """Ctrl-C while the workload runs: the harness exits 130 and the server is gone."""
    cmd = [sys.executable, SERVE, "--model", smollm2_path, "--requests", "50", "--rounds", "1",
           "--concurrency", "1", "--max-tokens", "64", "--workloads", "text", "--ctx", "1024",
           "--out", str(tmp_path / "x.json")]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=ROOT, start_new_session=True)
    url = None
    try:
        for line in p.stdout:
            if line.startswith("ggserve: ready"):
                url = line.split(" on ", 1)[1].split()[0]
                break
        assert url, "harness did not report a ready server"
        time.sleep(1.0)                                    # into the workload
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=60)[0]
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, rest
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
    assert not (tmp_path / "x.json").exists()


def test_report_reprints_a_saved_run(tmp_path, capsys):
    recs = [serve.summarize(_fake_cell(srv), max_tokens=4) for srv in (serve.GG, serve.LL)]
    doc = serve.common.envelope("serve", {"model": "/m/x.gguf", "threads": 2, "ctx": 4096,
                                          "parallel": 4, "max_tokens": 4, "rounds": 1},
                                recs, ratios=serve.ratios(recs), total_s=1.0)
    path = tmp_path / "r.json"
    serve.common.write_json(str(path), doc)
    assert "NaN" not in path.read_text()
    assert serve.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "x.gguf" in out and "ggserve/llama" in out and "1.00x" in out
