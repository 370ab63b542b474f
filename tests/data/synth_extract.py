"""golden.json for a tiny random-weight architecture folder (tests/data/FOLDER) from the
output of ../shared/golden/tools/make_synth_golden.py: the fields the tests read,
nothing else changed (ids, logprobs, renderings and messages as llama-server answered
them). Each folder's README.md gives its command line, e.g.

    python tests/data/synth_extract.py OUT_DIR --folder starcoder2 --vocab starcoder+granite_roles \\
        --arch starcoder2
    python tests/data/synth_extract.py OUT_DIR --folder ernie4_5 --vocab phi-3+ernie45_special \\
        --arch ernie4_5 --arch ernie4_5-moe=golden_moe.json --kv-lines "llama_kv_cache: size"

OUT_DIR: make_synth_golden.py --out. --arch ARCH[=FILE] (FILE golden.json unless given)
may repeat; the vocabulary's tokenization goes into the first one's file. Chats and
tokenization are kept when the run made them (not a --only completions run).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib

DATA = pathlib.Path(__file__).resolve().parent


def _steps(steps: list[dict]) -> list[dict]:
    keep = ("id", "probs_available", "bytes", "logprob")
    return [{**{k: s[k] for k in keep if k in s},
             **({"top_logprobs": [{"id": t["id"], "logprob": t["logprob"]} for t in s["top_logprobs"]]}
                if "top_logprobs" in s else {})} for s in steps]


def _completion(c: dict) -> dict:
    return {"key": c["key"], "prompt_ids": c["prompt_ids"], "generated_ids": c["generated_ids"],
            "n_steps_gap_below_0.05": c["n_steps_gap_below_0.05"], "steps": _steps(c["steps"])}


def _chat(c: dict) -> dict:
    cc = c["chat_completion"]
    return {"key": c["key"], "prompt": c["prompt"],
            "prompt_ids_add_special_parse_special": c["prompt_ids_add_special_parse_special"],
            "chat_completion": {"request": cc["request"], "prompt_tokens": cc["prompt_tokens"],
                                "finish_reason": cc["finish_reason"], "message": cc["message"],
                                "generated_ids": cc["generated_ids"], "steps": _steps(cc["steps"])}}


def _tokenized(s: dict) -> dict:
    return {"key": s["key"], "text": s["text"],
            "variants": {name: {"request": v["request"], "ids": v["ids"]} for name, v in s["variants"].items()}}


def _date_of(prompt: str) -> str:
    """The day the chats were rendered on (Granite 3.3's template prints it)."""
    day = prompt.split("Today's Date: ", 1)[1].split(". ", 1)[0]
    return datetime.datetime.strptime(day, "%B %d, %Y").date().isoformat()


def _read(out: pathlib.Path, name: str) -> dict | None:
    path = out / name
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def golden(out: pathlib.Path, arch: str, kv_lines: str, vocab: str | None) -> dict:
    """arch's golden dict; vocab: also the tokenization of that vocabulary."""
    comp, loads = _read(out, "synth_completions.json"), _read(out, "load_summary.json")
    model = comp["model_files"][arch]
    g = {
        "llama_cpp_build": comp["llama_cpp_build"], "server_common_args": comp["server_common_args"],
        "model_file": model["file"], "model_sha256": model["sha256"], "template": model["template"],
        "near_tie_stats": comp["near_tie_stats"][arch],
        "kv_cache_log": [line for line in loads[arch] if kv_lines in line],
        "completion_request": comp["request_defaults"],
        "completions": [_completion(c) for c in comp["models"][arch]],
    }
    chat = _read(out, "synth_chat.json")
    if chat is not None:
        g["chats"] = [_chat(c) for c in chat["models"][arch]]
        dated = [c["prompt"] for c in chat["models"][arch] if "Today's Date: " in c["prompt"]]
        if dated:
            g["date"] = _date_of(dated[0])
        if vocab is not None:
            g["tokenize"] = [_tokenized(s) for s in _read(out, "synth_tokenize.json")["vocabs"][vocab]["strings"]]
    return g


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir", help="make_synth_golden.py --out")
    p.add_argument("--folder", required=True, help="tests/data/FOLDER to write into")
    p.add_argument("--vocab", required=True, help="the vocabulary's name in synth_tokenize.json")
    p.add_argument("--arch", action="append", required=True, help="ARCH[=FILE], FILE golden.json unless given")
    p.add_argument("--kv-lines", default="llama_kv_cache", help="keep the load log lines holding this")
    args = p.parse_args(argv)
    for i, spec in enumerate(args.arch):
        arch, _, name = spec.partition("=")
        g = golden(pathlib.Path(args.out_dir), arch, args.kv_lines, args.vocab if i == 0 else None)
        (DATA / args.folder / (name or "golden.json")).write_text(json.dumps(g, ensure_ascii=False, indent=0) + "\n",
                                                                 encoding="utf-8")


if __name__ == "__main__":
    main()
