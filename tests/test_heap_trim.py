"""server/service/heap.py: the free pages the C heap keeps below live blocks go back to the
system when the service trims it (after the model loads, and when the engine falls idle)."""
import ctypes

from ggserve.server.service import heap


def resident_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def test_freed_blocks_below_a_live_one_are_given_back():
    # 64 MiB in 4 KiB blocks (below the mmap threshold: on the heap), the last one kept,
    # so no free() can shrink the heap from its top
    blocks = [ctypes.create_string_buffer(4096) for _ in range(16384)]
    for b in blocks:
        ctypes.memset(b, 1, 4096)
    last = blocks[-1]
    del blocks
    before = resident_bytes()
    assert heap.give_back()
    assert before - resident_bytes() > 32 * 2**20
    assert last.raw[:1] == b"\x01"


def test_the_loaded_models_objects_leave_the_cyclic_collector_until_it_is_closed(smollm2_path):
    """A full collection walks every object it tracks (~30 ms on a loaded 1B model: a pause
    in a stream); what exists once the model is loaded lives as long as the engine."""
    import gc

    from ggserve.server.engine.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(smollm2_path, n_ctx=512, n_parallel=1, n_threads=1))
    try:
        heap.after_load()
        assert gc.get_freeze_count() > 10_000
        tracked = len(gc.get_objects())
        assert tracked < gc.get_freeze_count()
    finally:
        heap.close_engine(engine)
    assert gc.get_freeze_count() == 0
