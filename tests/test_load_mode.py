"""-lm/--load-mode as llama-server 11434's: weights memory-mapped from the file, or read into
memory; mlock keeps them in RAM. Either way the greedy answer is llama.cpp's."""
from __future__ import annotations

import json
import pathlib

import pytest

from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.sampling.sampler import SamplingParams


@pytest.mark.parametrize("argv,use_mmap,mlock", [
    ([], True, False),
    (["-lm", "mmap"], True, False),
    (["--load-mode", "none"], False, False),
    (["-lm", "dio"], False, False),
    (["-lm", "mlock"], False, True),
    (["-lm", "mmap+mlock"], True, True),
    (["--no-mmap"], False, False),
    (["--mlock"], True, True),
])
def test_load_mode_flags(smollm2_path, argv, use_mmap, mlock):
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, *argv]))
    assert (cfg.use_mmap, cfg.mlock) == (use_mmap, mlock)


GOLDEN = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]["smollm2"][0]


def _greedy(engine, n=12):
    engine.add(Request("r", GOLDEN["prompt_ids"], SamplingParams(temperature=0.0), max_tokens=n, ignore_eos=True))
    out = []
    while engine.has_work():
        out += [ev.token for ev in engine.step() if ev.token is not None]
    return out


def test_weights_read_into_memory_and_locked_answer_as_llama_cpp(smollm2_path):
    # llama.cpp's greedy tokens for the golden prompt (tests/data/completions.json), mapped or read
    mapped = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1))
    read = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, use_mmap=False, mlock=True))
    try:
        assert _greedy(read) == _greedy(mapped) == GOLDEN["generated_ids"][:12]
        # no CPU weight buffer of the read model points into a file mapping
        assert not any(b.mapped for b in read.loaded.weights.values())
        assert any(b.mapped for b in mapped.loaded.weights.values())
    finally:
        mapped.close()
        read.close()


def _locked_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmLck:"))


def test_mlock_keeps_the_weights_in_ram_or_says_why_not(smollm2_path, caplog):
    before = _locked_kib()
    engine = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, mlock=True))
    try:
        weights_kib = sum(b.nbytes for b in engine.loaded.weights.values()) // 1024
        refused = [r for r in caplog.records if "--mlock" in r.getMessage()]
        # locked (root, or a high enough ulimit -l), or a warning naming the file, as llama-server
        assert _locked_kib() - before >= weights_kib * 0.99 or (refused and smollm2_path in refused[0].getMessage())
    finally:
        engine.close()
