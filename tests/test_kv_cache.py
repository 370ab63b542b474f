"""KV cache bookkeeping: where a batch's tokens go, what each sequence attends over."""
import numpy as np
import pytest

from ggserve.native import ggml
from ggserve.server.engine.kernel_parity import attention_calls
from ggserve.server.engine.memory.kv_cache import KVCache, KVCacheFull, LayerKV


@pytest.fixture(scope="module")
def backend():
    b = ggml.Backend(n_threads=1, use_gpu=False)
    yield b
    b.close()


def _cache(backend, size=1024, regions=4):
    return KVCache(backend, [LayerKV(8, 8, backend.cpu)], size, n_regions=regions)


def _add(kv, seq, n):
    """Place and commit n more tokens of seq, as a step does."""
    cells = kv.find_cells_for([seq], [n])
    start = len(np.flatnonzero((kv.seqs >> np.uint64(seq)) & np.uint64(1)))
    kv.commit(cells, np.full(n, seq), np.arange(start, start + n, dtype=np.int32))
    return cells


def test_a_sequence_fills_its_own_region_in_order(backend):
    kv = _cache(backend)
    assert _add(kv, 2, 3).tolist() == [512, 513, 514]
    assert _add(kv, 2, 1).tolist() == [515]
    assert _add(kv, 0, 2).tolist() == [0, 1]


def test_a_batch_of_several_sequences_gets_each_its_cells_above_its_last(backend):
    kv = _cache(backend)
    _add(kv, 1, 5)
    _add(kv, 3, 2)
    cells = kv.find_cells_for([1, 3, 0], [1, 1, 4])
    assert cells.tolist() == [261, 770, 0, 1, 2, 3]


def test_a_full_region_spills_above_it(backend):
    kv = _cache(backend)
    _add(kv, 0, 255)
    assert _add(kv, 0, 3).tolist() == [255, 256, 257]


def test_cells_freed_below_a_sequence_are_not_reused_while_cells_above_are_free(backend):
    kv = _cache(backend)
    _add(kv, 0, 10)
    kv.seq_rm(0, 0, 5)                   # cells 0..4 free again, the sequence ends at cell 9
    assert _add(kv, 0, 2).tolist() == [10, 11]


def test_the_planned_cells_equal_a_full_scan_after_removals_and_copies(backend):
    kv = _cache(backend, size=256, regions=4)
    rng = np.random.default_rng(7)
    for _ in range(200):
        seq = int(rng.integers(0, 4))
        op = rng.integers(0, 4)
        if op == 0 and kv.n_used:
            kv.seq_rm(seq, int(rng.integers(0, 40)))
        elif op == 1:
            kv.seq_cp(seq, (seq + 1) % 4, 0, int(rng.integers(0, 40)))
        batch = [int(s) for s in rng.permutation(4)[: rng.integers(1, 4)]]
        counts = [int(rng.integers(1, 6)) for _ in batch]
        if kv.n_free < sum(counts):
            kv.clear()
        planned = kv.find_cells_for(batch, counts)
        scratch = _cache(backend, size=256, regions=4)     # same cells, nothing remembered
        scratch.pos[:], scratch.seqs[:] = kv.pos, kv.seqs
        assert planned.tolist() == scratch._find_cells_scanning(batch, counts).tolist()
        scratch.close()
        kv.commit(planned, np.repeat(batch, counts), np.full(len(planned), 1000, dtype=np.int32))


def test_a_batch_larger_than_the_free_cells_is_refused(backend):
    kv = _cache(backend, size=256, regions=1)
    _add(kv, 0, 250)
    with pytest.raises(KVCacheFull, match="need 8 KV cells, 6 free"):
        kv.find_cells_for([0], [8])


def test_a_sequence_attends_from_its_first_cell_over_a_multiple_of_256(backend):
    kv = _cache(backend, size=2048, regions=2)
    _add(kv, 1, 300)
    assert kv.view_for(1) == (1024, 1536)


def test_rows_of_sequences_in_distant_regions_get_separate_attention_calls(backend):
    kv = _cache(backend, size=4096, regions=4)
    for seq in (0, 1, 2):
        _add(kv, seq, 10)
    kv.commit(kv.find_cells_for([0, 1, 2], [1, 1, 1]), np.array([0, 1, 2]), np.full(3, 10, dtype=np.int32))
    calls = attention_calls(np.array([0, 1, 2]), np.zeros(3, dtype=bool), kv.view_for)
    assert calls == [(0, 1, 0, 256, 1), (1, 2, 1024, 1280, 1), (2, 3, 2048, 2304, 1)]


def test_rows_of_sequences_with_close_cells_share_one_attention_call(backend):
    kv = _cache(backend, size=1024, regions=8)      # 128-cell regions: views overlap
    for seq in (0, 1):
        _add(kv, seq, 10)
    calls = attention_calls(np.array([0, 0, 1]), np.zeros(3, dtype=bool), kv.view_for)
    assert calls == [(0, 3, 0, 384, 3)]
