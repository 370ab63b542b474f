"""--checkpoint-min-step (-cms) as llama-server 11434's: which context checkpoints a
4-turn chat on a hybrid model (the synthetic Qwen3.5) leaves in its slot after each turn,
with --ctx-checkpoints 4 and three spacings, against the checkpoints llama-server's log
(-lv 4) says it created and erased (tests/data/checkpoints: make_reference.py, README.md).
With the default 8192 a full list drops an earlier request's checkpoints close to the one
before them and keeps the first; with 0 it drops the one furthest back."""
import json
import pathlib

import httpx
import pytest
from server_harness import RunningServer
from synth_golden import model_path

from ggserve.server.app import ServerConfig, create_app
from ggserve.server.cli.main import config_from_args, serve_parser

REF = json.loads((pathlib.Path(__file__).parent / "data" / "checkpoints" / "checkpoints.json").read_text())


def _held_after_each_turn(min_step: int, messages: list[dict]) -> list[tuple[int, int, list[int]]]:
    """(prompt tokens, cached tokens, the slot's checkpoint positions) after each user turn,
    llama-server's answers as the assistant turns."""
    cfg = ServerConfig(model=model_path("qwen35"), n_ctx=4096, n_parallel=1, n_threads=1, ctx_checkpoints=4,
                       checkpoint_min_step=min_step)
    app, out, sent = create_app(cfg), [], []
    with RunningServer(app) as srv:
        for msg in messages:
            sent.append(msg)
            if msg["role"] != "user":
                continue
            r = httpx.post(srv.url + "/v1/chat/completions", timeout=600,
                           json={"messages": sent, "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            held = sorted(app.state.service.engine.memory.recurrent.snaps[0])
            out.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], held))
    return out


@pytest.mark.parametrize("min_step", ["8192", "100", "0"])
def test_the_checkpoints_kept_are_llama_servers(min_step):
    run = REF["runs"][min_step]
    want = [(t["prompt_tokens"], t["cached_tokens"], t["held"]) for t in run["turns"]]
    assert _held_after_each_turn(int(min_step), run["messages"]) == want


@pytest.mark.parametrize("argv,env,n", [([], {}, 8192), (["-cms", "0"], {}, 0),
                                        (["--checkpoint-min-step", "300"], {}, 300),
                                        ([], {"LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT": "64"}, 64)])
def test_the_flag_reads_as_llama_servers(smollm2_path, monkeypatch, argv, env, n):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert config_from_args(serve_parser().parse_args(["-m", smollm2_path, *argv])).checkpoint_min_step == n


def test_a_negative_spacing_is_refused_naming_the_flag(smollm2_path):
    with pytest.raises(SystemExit, match="--checkpoint-min-step must be >= 0"):
        config_from_args(serve_parser().parse_args(["-m", smollm2_path, "-cms", "-1"]))
