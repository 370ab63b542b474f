"""Record llama-server 11434's answers for tests/test_swa_ring_snapshots.py: Gemma 3 270M's
sliding-window ring saved to a slot file, restored into another slot, and kept in the
host-RAM prompt cache (README.md here says what ring_snapshots.json holds).

usage: python make_ring_snapshots.py LLAMA_SERVER   (the AVX2 build: the answers are numeric)
"""
import json
import sys
import tempfile

import httpx
from make_reference import HERE, URL, gemma3_path, serve, stop

ARGS = ["-t", "2", "-c", "4096", "-np", "2", "--cache-ram", "0"]
HOST_ARGS = ["-t", "2", "-c", "4096", "-np", "1"]        # --cache-ram at its default (8192 MiB)
N_FIRST, N_NEXT = 64, 16


def complete(prompt: list[int], n_predict: int, slot: int = -1) -> dict:
    r = httpx.post(URL + "/completion", json={
        "prompt": prompt, "n_predict": n_predict, "temperature": 0, "ignore_eos": True, "return_tokens": True,
        "cache_prompt": True, "id_slot": slot}, timeout=1800).json()
    return {"tokens": r["tokens"], "cache_n": r["timings"]["cache_n"], "prompt_n": r["timings"]["prompt_n"]}


def slot_action(slot: int, action: str, filename: str) -> dict:
    return httpx.post(f"{URL}/slots/{slot}?action={action}", json={"filename": filename}, timeout=600).json()


def main() -> None:
    binary = sys.argv[1]
    golden = json.loads((HERE.parent / "completions.json").read_text())["models"]["gemma3"]
    prompt = next(c for c in golden if c["key"] == "long_code")["prompt_ids"]
    other = next(c for c in golden if c["key"] == "long_prose")["prompt_ids"]
    out = {"prompt_ids": prompt, "other_prompt_ids": other, "n_first": N_FIRST, "n_next": N_NEXT}
    proc, _ = serve(binary, gemma3_path(), ARGS)        # the uninterrupted answer
    try:
        out["uninterrupted"] = complete(prompt, N_FIRST + N_NEXT, 0)
    finally:
        stop(proc)
    with tempfile.TemporaryDirectory() as folder:
        proc, _ = serve(binary, gemma3_path(), [*ARGS, "--slot-save-path", folder + "/"])
        try:
            first = complete(prompt, N_FIRST, 0)
            saved = slot_action(0, "save", "ring.bin")
            restored = slot_action(1, "restore", "ring.bin")
            out["slot_file"] = {"args": ARGS, "first": first, "n_saved": saved["n_saved"],
                                "n_restored": restored["n_restored"],
                                "next": complete(prompt + first["tokens"], N_NEXT, 1)}
        finally:
            stop(proc)
    proc, _ = serve(binary, gemma3_path(), HOST_ARGS)
    try:
        first = complete(prompt, N_FIRST)
        between = complete(other, 8)            # takes the one slot: the first prompt goes to host RAM
        out["host_cache"] = {"args": HOST_ARGS, "first": first, "between": between,
                             "next": complete(prompt + first["tokens"], N_NEXT)}
    finally:
        stop(proc)
    (HERE / "ring_snapshots.json").write_text(json.dumps(out, indent=1) + "\n")
    (HERE / "_server.log").unlink()


if __name__ == "__main__":
    main()
