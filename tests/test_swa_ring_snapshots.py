"""Gemma 3 270M's sliding-window ring (window 512, 1,024 cells at -c 4096) kept with the
rest of a slot's memory: in a slot file restored into another slot, copied to another
slot, and through the host-RAM prompt cache, as llama-server 11434's iSWA cache saves
and restores both of its caches (llama-kv-cache-iswa.cpp state_write / state_read). The
golden's 982-token long_code prompt and 64 generated tokens wrap the ring; the next
request continues them. llama-server's answers: tests/data/swa_memory/ring_snapshots.json
(make_ring_snapshots.py, README.md there)."""
import dataclasses
import json
import math
import pathlib

import pytest
from engine_helpers import GREEDY, generate_requests, tokens

from ggserve.server.engine.engine import Engine, EngineConfig, Request
from ggserve.server.engine.memory import slot_files
from ggserve.server.engine.memory.snapshot import layout

REF = json.loads((pathlib.Path(__file__).parent / "data" / "swa_memory" / "ring_snapshots.json").read_text())
PROMPT, N_FIRST, N_NEXT = REF["prompt_ids"], REF["n_first"], REF["n_next"]
CONTINUATION = REF["uninterrupted"]["tokens"][N_FIRST:]      # llama-server's, never interrupted


def _run(e: Engine, rid: str, prompt: list[int], n: int, slot: int = -1) -> list:
    """Greedy, EOG tokens banned as llama-server's ignore_eos bans them."""
    no_eog = dataclasses.replace(GREEDY, logit_bias={t: -math.inf for t in e.tokenizer.eog_ids})
    return generate_requests(e, [Request(rid, list(prompt), no_eog, max_tokens=n, ignore_eos=True,
                                         id_slot=slot)])[rid]


@pytest.fixture(scope="module")
def two_slots(gemma3_path):
    e = Engine(EngineConfig(gemma3_path, n_ctx=4096, n_parallel=2, n_threads=2, cache_ram_mb=0))
    yield e
    e.close()


@pytest.fixture(scope="module")
def first(two_slots):
    """The first request in slot 0: llama-server's 64 tokens, and the ring wrapped. Slot 0
    keeps it for the tests below, in file order (the last one erases it)."""
    two_slots.clear_cache()
    out = tokens(_run(two_slots, "first", PROMPT, N_FIRST, slot=0))
    assert out == REF["slot_file"]["first"]["tokens"] == REF["uninterrupted"]["tokens"][:N_FIRST]
    assert two_slots.memory.swa.size // 2 == 1024 and len(PROMPT) + N_FIRST - 1 > 1024
    return out


def test_a_slot_file_keeps_the_ring_cells_in_ring_order(two_slots, first, tmp_path):
    """The file holds the sequence's 1,024 ring cells, newest positions first (the ring
    wrapped), as llama.cpp writes a cache's cells in cell order."""
    e = two_slots
    e.save_slot(0, str(tmp_path / "ring.bin"))
    snap = slot_files.load(str(tmp_path / "ring.bin"), e._fingerprint, layout(e.memory), e.n_ctx)
    n = len(PROMPT) + N_FIRST - 1
    wrapped = n - 1024
    assert snap.ring.positions.tolist() == [*range(1024, n), *range(wrapped, 1024)]


def test_a_ring_slot_file_is_refused_by_a_server_without_a_ring(gemma3_path, two_slots, first, tmp_path):
    e = two_slots
    e.save_slot(0, str(tmp_path / "ring.bin"))
    full = Engine(EngineConfig(gemma3_path, n_ctx=4096, n_parallel=1, n_threads=2, swa_full=True))
    try:
        with pytest.raises(slot_files.SlotFileError, match="another KV cache layout"):
            full.restore_slot(0, str(tmp_path / "ring.bin"))
    finally:
        full.close()


def test_another_slot_takes_the_prefix_with_its_ring_cells(two_slots, first):
    """A prompt in slot 1 continuing slot 0's conversation copies slot 0's memory, ring
    included, and continues as llama-server's uninterrupted answer."""
    e = two_slots
    out = _run(e, "next", PROMPT + first, N_NEXT, slot=1)
    assert out[-1].n_cached == len(PROMPT) + N_FIRST - 1
    assert tokens(out) == CONTINUATION


def test_a_ring_saved_and_restored_into_another_slot_continues_as_llama_server(two_slots, first, tmp_path):
    e, ref = two_slots, REF["slot_file"]
    n_saved, _ = e.save_slot(0, str(tmp_path / "ring.bin"))
    assert n_saved == ref["n_saved"] == len(PROMPT) + N_FIRST - 1
    assert e.restore_slot(1, str(tmp_path / "ring.bin")) == (ref["n_restored"], ref["n_saved"])
    e.erase_slot(0)                   # the continuation can only come from the restored slot
    out = _run(e, "next", PROMPT + first, N_NEXT, slot=1)
    # every token restored is reused; llama-server reuses none: it saves the 512 positions the
    # window shows the last token (533..1044) and asks for one more (pos_min < n_past - n_swa)
    assert (out[-1].n_cached, ref["next"]["cache_n"]) == (len(PROMPT) + N_FIRST - 1, 0)
    assert tokens(out) == ref["next"]["tokens"] == CONTINUATION


def test_a_ring_kept_in_host_ram_comes_back_as_llama_servers(gemma3_path):
    """One slot: another prompt takes it, the first conversation waits in host RAM, ring
    included, and its next turn reuses more of it than llama-server and continues as its."""
    ref = REF["host_cache"]
    e = Engine(EngineConfig(gemma3_path, n_ctx=4096, n_parallel=1, n_threads=2))
    try:
        first = tokens(_run(e, "first", PROMPT, N_FIRST))
        assert first == ref["first"]["tokens"]
        _run(e, "between", REF["other_prompt_ids"], 8)
        assert e.slots.host.stored == 1
        out = _run(e, "next", PROMPT + first, N_NEXT)
        assert e.slots.host.restored == 1
        # all of it; llama-server goes back to its context checkpoint 4 tokens before the first
        # prompt's end (977 tokens: its saved ring misses one position, see above)
        assert (out[-1].n_cached, ref["next"]["cache_n"]) == (len(PROMPT) + N_FIRST - 1, 977)
        assert tokens(out) == ref["next"]["tokens"] == CONTINUATION
    finally:
        e.close()


def test_a_ring_every_slot_shares_takes_back_the_window_when_it_has_no_room_for_more(gemma3_path, tmp_path):
    """A unified cache (one 1,536-cell ring for 2 slots): slot 0's 1,045 ring cells do not
    fit beside themselves, so slot 1 takes back the 512 the window shows the next token
    (what llama.cpp's state_write saves) and still reuses every token."""
    e = Engine(EngineConfig(gemma3_path, n_ctx=4096, n_parallel=2, kv_unified=True, n_threads=2, cache_ram_mb=0))
    try:
        first = tokens(_run(e, "first", PROMPT, N_FIRST, slot=0))
        e.save_slot(0, str(tmp_path / "ring.bin"))
        n = len(PROMPT) + N_FIRST - 1
        assert e.restore_slot(1, str(tmp_path / "ring.bin")) == (n, n)
        ring = e.memory.swa
        assert ring.size == 1536 and sorted(ring.pos[ring._cells_of(1)].tolist()) == list(range(n - 512, n))
        e.erase_slot(0)
        out = _run(e, "next", PROMPT + first, N_NEXT, slot=1)
        assert out[-1].n_cached == n and tokens(out) == CONTINUATION
    finally:
        e.close()
