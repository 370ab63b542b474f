"""llama-server's logging and key-file flags: --log-disable, --log-file, -lv, --log-jsonl,
--log-prefix/--log-timestamps, --api-key-file (common/arg.cpp of build 11434 says what each does)."""
from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.cli.llama_flags import llama_argv
from ggserve.server.cli.log_flags import setup_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    for h in root.handlers:
        if h not in handlers:
            h.close()
    root.handlers[:] = handlers
    root.setLevel(level)


def args(*argv):
    return serve_parser().parse_args(llama_argv(["-m", "model.gguf", *argv]))


@pytest.mark.parametrize("lv,level", [(0, logging.CRITICAL), (1, logging.ERROR), (2, logging.WARNING),
                                      (3, logging.INFO), (4, logging.DEBUG), (5, logging.DEBUG)])
def test_verbosity_threshold_maps_to_log_levels(restore_logging, lv, level):
    setup_logging(args("-lv", str(lv)))
    assert logging.getLogger().level == level


def test_log_disable_silences_every_logger(restore_logging):
    kw = setup_logging(args("--log-disable"))
    assert not logging.getLogger("ggserve.server").isEnabledFor(logging.CRITICAL)
    assert kw["log_level"] == "critical" and kw["log_config"] is None


def test_log_file_gets_json_lines(restore_logging, tmp_path):
    path = tmp_path / "server.log"
    setup_logging(args("--log-file", str(path), "--log-jsonl"))
    logging.getLogger("ggserve.test").warning("slot %d saved", 3)
    for h in logging.getLogger().handlers:
        h.flush()
    line = json.loads(path.read_text().splitlines()[-1])
    assert (line["level"], line["logger"], line["message"]) == ("warning", "ggserve.test", "slot 3 saved")


def test_no_prefix_no_timestamps_leave_the_message_alone(restore_logging, tmp_path):
    path = tmp_path / "server.log"
    setup_logging(args("--log-file", str(path), "--no-log-prefix", "--no-log-timestamps"))
    logging.getLogger("ggserve.test").info("hello")
    for h in logging.getLogger().handlers:
        h.flush()
    assert path.read_text().splitlines()[-1] == "hello"


def test_api_key_file_lines_are_keys_and_hash_lines_comments(tmp_path, smollm2_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nsk-one\n\nsk-two\n")
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, "--api-key", "sk-zero",
                                                      "--api-key-file", str(keys)]))
    assert cfg.api_keys == ["sk-zero", "sk-one", "sk-two"]


def test_missing_api_key_file_stops_the_server_naming_it(tmp_path, smollm2_path):
    missing = str(tmp_path / "nope")
    with pytest.raises(SystemExit) as e:
        config_from_args(serve_parser().parse_args(["-m", smollm2_path, "--api-key-file", missing]))
    assert missing in str(e.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_served_model_logs_json_lines_to_its_file_and_its_terminal(smollm2_path, tmp_path):
    path, port = tmp_path / "server.log", _free_port()
    p = subprocess.Popen([sys.executable, "-m", "ggserve.server.cli.main", "serve", "-m", smollm2_path, "-t", "1",
                          "--port", str(port), "--no-webui", "--log-file", str(path), "--log-jsonl"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60,
                          json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert any(entry["logger"] == "uvicorn.access" and "/v1/completions" in entry["message"] for entry in lines)
    assert all(json.loads(line) for line in err.splitlines() if line.strip())
