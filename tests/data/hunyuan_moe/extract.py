"""golden.json from the output of ../shared/golden/tools/make_synth_golden.py run on
the hunyuan-moe model (see README.md): the fields the tests read, nothing else
changed (ids, logprobs, renderings and messages as llama-server answered them).

    python tests/data/hunyuan_moe/extract.py OUT_DIR   # OUT_DIR: make_synth_golden.py --out
"""
from __future__ import annotations

import json
import pathlib
import sys

ARCH, VOCAB = "hunyuan-moe", "gpt-2 (hunyuan-moe)"
HERE = pathlib.Path(__file__).resolve().parent


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


def main(out_dir: str, name: str = "golden.json") -> None:
    out = pathlib.Path(out_dir)
    comp = json.loads((out / "synth_completions.json").read_text(encoding="utf-8"))
    loads = json.loads((out / "load_summary.json").read_text(encoding="utf-8"))
    model = comp["model_files"][ARCH]
    golden = {
        "llama_cpp_build": comp["llama_cpp_build"], "server_common_args": comp["server_common_args"],
        "model_file": model["file"], "model_sha256": model["sha256"], "template": model["template"],
        "near_tie_stats": comp["near_tie_stats"][ARCH],
        "kv_cache_log": [line for line in loads[ARCH] if "llama_kv_cache" in line],     # both caches, with their kinds
        "completion_request": comp["request_defaults"],
        "completions": [_completion(c) for c in comp["models"][ARCH]],
    }
    if (out / "synth_chat.json").exists():
        chat = json.loads((out / "synth_chat.json").read_text(encoding="utf-8"))
        tok = json.loads((out / "synth_tokenize.json").read_text(encoding="utf-8"))
        golden["chats"] = [_chat(c) for c in chat["models"][ARCH]]
        golden["tokenize"] = [_tokenized(s) for s in tok["vocabs"][VOCAB]["strings"]]
    (HERE / name).write_text(json.dumps(golden, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:3])
