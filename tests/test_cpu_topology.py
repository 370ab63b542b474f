"""ggml's default thread count: one per physical core, as llama-server's."""
import os

from ggserve.server.cli import config_from_args, serve_parser
from ggserve.server.cpu_topology import default_threads, physical_cores
from ggserve.server.engine import Engine


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
    engine = Engine(smollm2_path, n_ctx=256, n_parallel=1, n_threads=cfg.n_threads)
    try:
        assert engine.n_threads == physical_cores()
    finally:
        engine.close()
