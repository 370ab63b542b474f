"""ggml's CPU threads: one per physical core by default, as llama-server; -t for a lone decode row, -tb for larger steps."""
import os

from ggserve.server.cli.main import config_from_args, serve_parser
from ggserve.server.engine.cpu_topology import default_threads, physical_cores
from ggserve.server.engine.engine import EngineConfig, Engine, Request
from ggserve.server.engine.sampling.sampler import SamplingParams


def _topology(root, siblings: dict[int, str]) -> str:
    for cpu, text in siblings.items():
        os.makedirs(root / f"cpu{cpu}" / "topology")
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(text + "\n")
    return str(root)


def test_hyperthread_siblings_count_as_one_core(tmp_path):
    sysfs = _topology(tmp_path, {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"})
    assert physical_cores(range(4), sysfs) == 2


def test_only_the_cpus_the_process_may_use_count(tmp_path):
    sysfs = _topology(tmp_path, {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"})
    assert physical_cores({2, 3}, sysfs) == 1


def test_without_topology_each_cpu_is_a_core(tmp_path):
    assert physical_cores(range(3), str(tmp_path)) == 3


def test_a_thread_count_given_is_kept():
    assert default_threads(3) == 3
    assert default_threads(0) == physical_cores()


def test_serve_gives_ggml_one_thread_per_physical_core_by_default(smollm2_path):
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path]))
    engine = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, n_threads=cfg.n_threads))
    try:
        assert engine.n_threads == physical_cores()
    finally:
        engine.close()


def test_threads_batch_is_a_llama_server_flag(smollm2_path):
    cfg = config_from_args(serve_parser().parse_args(["-m", smollm2_path, "-t", "1", "-tb", "2"]))
    assert (cfg.n_threads, cfg.n_threads_batch) == (1, 2)
    assert config_from_args(serve_parser().parse_args(["-m", smollm2_path])).n_threads_batch == -1


def test_a_prompt_step_runs_on_tb_threads_and_a_lone_decode_row_on_t(smollm2_path):
    # llama.cpp: a ubatch of one token computes with -t threads, a larger one with -tb
    engine = Engine(EngineConfig(smollm2_path, n_ctx=256, n_parallel=1, n_threads=1, n_threads_batch=2))
    used = []
    engine.runner.backend = _Recording(engine.runner.backend, used)
    try:
        engine.add(Request("r", [1, 2, 3, 4, 5], SamplingParams(temperature=0.0), max_tokens=3, ignore_eos=True))
        while engine.has_work():
            engine.step()
    finally:
        engine.runner.backend = engine.runner.backend.inner
        engine.close()
    assert used == [2, 1, 1]      # the 5-token prompt, then two decode steps


class _Recording:
    """The backend, noting the thread count each graph computes with."""

    def __init__(self, inner, used):
        self.inner, self.used = inner, used

    def compute(self, graph, inputs):
        self.used.append(self.inner.n_threads)
        return self.inner.compute(graph, inputs)

    def __getattr__(self, name):
        return getattr(self.inner, name)
