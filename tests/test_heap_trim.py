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
