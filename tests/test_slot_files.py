"""Slot files and the /slots endpoints: save -> restart -> restore gives the same
answer; truncated, corrupt, foreign and hostile files and paths outside the folder
are a 400, never a crash or a read outside --slot-save-path."""
from __future__ import annotations

import json
import os
import struct

import httpx
import pytest

from ggserve.server.engine.memory import slot_files
from ggserve.server.app import ServerConfig, create_app
from ggserve.server.engine.memory.slot_files import SlotFileError
from server_harness import RunningServer

PROMPT = [{"role": "system", "content": "You are a concise assistant for a museum about the sea."},
          {"role": "user", "content": "Which animal in the museum is the largest?"}]


def _serve(model, folder=None, **kw):
    cfg = ServerConfig(model=model, n_ctx=2048, n_parallel=2, n_threads=1, n_batch=256,
                       slot_save_path=None if folder is None else str(folder), **kw)
    return RunningServer(create_app(cfg))


def _chat(url, messages=PROMPT):
    r = httpx.post(url + "/v1/chat/completions", timeout=120,
                   json={"messages": messages, "max_tokens": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def _slot_action(url, slot, action, filename=None):
    body = {} if filename is None else {"filename": filename}
    return httpx.post(f"{url}/slots/{slot}?action={action}", json=body, timeout=60)


@pytest.fixture(scope="module")
def saved(smollm2_path, tmp_path_factory):
    """A slot file saved after one chat, and that chat's answer and usage."""
    folder = tmp_path_factory.mktemp("slots")
    with _serve(smollm2_path, folder) as srv:
        out = _chat(srv.url)
        slots = httpx.get(srv.url + "/slots").json()
        slot = next(s["id"] for s in slots if s.get("n_prompt_tokens"))
        r = _slot_action(srv.url, slot, "save", "chat.bin")
        assert r.status_code == 200, r.text
    return folder, out, r.json()


@pytest.fixture(scope="module")
def server(smollm2_path, saved):
    with _serve(smollm2_path, saved[0]) as srv:
        yield srv


def test_save_then_restart_then_restore_gives_the_same_answer_from_cache(server, saved):
    folder, before, save = saved
    assert save["n_saved"] == before["usage"]["prompt_tokens"] + before["usage"]["completion_tokens"] - 1
    assert save["n_written"] == os.path.getsize(folder / "chat.bin")
    r = _slot_action(server.url, 1, "restore", "chat.bin")
    assert r.status_code == 200, r.text
    assert r.json()["n_restored"] == save["n_saved"] and r.json()["n_read"] == save["n_written"]
    after = _chat(server.url)
    assert after["choices"][0]["message"]["content"] == before["choices"][0]["message"]["content"]
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == after["usage"]["prompt_tokens"] - 1
    assert _slot_action(server.url, 1, "erase").json() == {"id_slot": 1, "n_erased": save["n_saved"]}


def test_slots_lists_each_slot_as_llama_server_does(server):
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1]
    n_ctx = server.app.state.service.engine.n_ctx
    assert all(s["n_ctx"] == n_ctx and s["is_processing"] is False for s in slots)


def _refused(server, filename):
    r = _slot_action(server.url, 0, "restore", filename)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    return r.json()["error"]["message"]


def _copy_with(saved, name, edit):
    folder = saved[0]
    data = bytearray((folder / "chat.bin").read_bytes())
    (folder / name).write_bytes(bytes(edit(data)))


def test_a_truncated_slot_file_is_refused(server, saved):
    _copy_with(saved, "short.bin", lambda d: d[:-100])
    assert "truncated" in _refused(server, "short.bin")


def test_a_corrupt_slot_file_is_refused(server, saved):
    def flip(d):
        d[-5] ^= 0xFF
        return d
    _copy_with(saved, "flipped.bin", flip)
    assert "corrupt" in _refused(server, "flipped.bin")


def test_a_file_that_is_not_a_slot_file_is_refused(server, saved):
    (saved[0] / "junk.bin").write_bytes(b"hello world, not a slot" * 10)
    assert "not a ggserve slot file" in _refused(server, "junk.bin")


def _rewrite_header(saved, name, change):
    """A copy of the saved file with its JSON header changed (body untouched)."""
    def edit(d):
        n = struct.unpack("<I", bytes(d[12:16]))[0]
        header = change(json.loads(bytes(d[16:16 + n])))
        raw = json.dumps(header).encode()
        return d[:12] + struct.pack("<I", len(raw)) + raw + d[16 + n:]
    _copy_with(saved, name, edit)


def test_a_slot_file_of_another_model_is_refused(server, saved):
    _rewrite_header(saved, "other-model.bin", lambda h: {**h, "model": "0" * 64})
    assert "another model" in _refused(server, "other-model.bin")


def test_a_slot_file_of_another_cache_type_is_refused(server, saved):
    _rewrite_header(saved, "q8.bin", lambda h: {**h, "layout": {**h["layout"], "type_k": "q8_0"}})
    assert "another KV cache layout" in _refused(server, "q8.bin")


def test_a_slot_file_claiming_more_tokens_than_a_slot_holds_is_refused(server, saved):
    _rewrite_header(saved, "huge.bin", lambda h: {**h, "n_tokens": 10**12})
    assert "tokens" in _refused(server, "huge.bin")


@pytest.mark.parametrize("name", ["../chat.bin", "/etc/passwd", ".hidden", "a/b.bin", "..", "", 7])
def test_a_filename_outside_the_folder_is_refused(server, name):
    for action in ("save", "restore"):
        r = _slot_action(server.url, 0, action, name)
        assert r.status_code == 400 and "plain file name" in r.json()["error"]["message"]


def test_saving_over_a_folder_is_refused(server, saved):
    os.mkdir(saved[0] / "a-folder")
    _chat(server.url)
    busy = next(s["id"] for s in httpx.get(server.url + "/slots").json() if s.get("n_prompt_tokens"))
    r = _slot_action(server.url, busy, "save", "a-folder")
    assert r.status_code == 400 and "cannot write" in r.json()["error"]["message"]
    assert os.path.isdir(saved[0] / "a-folder")


def test_a_link_inside_the_folder_is_not_followed(server, saved):
    os.symlink("/etc/hostname", saved[0] / "link.bin")
    assert "cannot open" in _refused(server, "link.bin")


def test_an_unknown_slot_or_action_is_refused(server):
    assert _slot_action(server.url, 9, "erase").status_code == 400
    assert _slot_action(server.url, 0, "explode").status_code == 400


def test_without_a_save_path_actions_and_with_no_slots_the_listing_are_not_supported(smollm2_path):
    with _serve(smollm2_path, None, slots_endpoint=False) as srv:
        assert _slot_action(srv.url, 0, "erase").status_code == 501
        assert httpx.get(srv.url + "/slots").status_code == 501


def test_load_refuses_a_newer_format_version(tmp_path, saved):
    data = bytearray((saved[0] / "chat.bin").read_bytes())
    data[8:12] = struct.pack("<I", slot_files.FORMAT_VERSION + 1)
    (tmp_path / "v2.bin").write_bytes(bytes(data))
    header = json.loads(bytes(data[16:16 + struct.unpack("<I", bytes(data[12:16]))[0]]))
    with pytest.raises(SlotFileError, match="version"):
        slot_files.load(str(tmp_path / "v2.bin"), header["model"], header["layout"], 1024)


def test_a_hybrid_models_slot_file_brings_back_its_recurrent_state(tmp_path):
    from ggserve.server.engine.memory import snapshot as memory_snapshot
    from ggserve.server.engine.engine import EngineConfig, Engine, Request
    from ggserve.server.chat.prompts import PromptBuilder
    from engine_helpers import GREEDY, generate_requests, tokens
    from synth_golden import model_path

    e = Engine(EngineConfig(model_path("qwen35"), n_ctx=2048, n_parallel=1, n_threads=1, cache_ram_mb=0))
    try:
        def ask(rid, messages):
            p = PromptBuilder.for_engine(e).chat(messages)
            ev = generate_requests(e, [Request(rid, p.tokens, GREEDY, max_tokens=6, ignore_eos=True,
                                               turn_starts=p.turn_starts)])[rid]
            return tokens(ev), [x.logprob for x in ev], ev[0].n_cached

        turn1 = [{"role": "user", "content": "What is 2 + 2?"}]
        turn2 = turn1 + [{"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3 * 5?"}]
        ask("t1", turn1)
        model, layout = slot_files.model_fingerprint(e.loaded.gguf), memory_snapshot.layout(e.memory)
        slot_files.save(str(tmp_path / "s.bin"), e.slots.snapshot(0), model, layout)
        kept = ask("t2-kept", turn2)
        e.clear_cache()
        snap = slot_files.load(str(tmp_path / "s.bin"), model, layout, e.n_ctx)
        assert len(snap.states) >= 2 and e.slots.load(0, snap) == snap.n
        assert ask("t2-restored", turn2) == kept and kept[2] > 0
    finally:
        e.close()
