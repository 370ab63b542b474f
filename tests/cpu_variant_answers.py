"""Greedy answers of the engine on a recording's prompts, as JSON on stdout.

Run in a process of its own (tests/test_cpu_variants.py): the ggml CPU variant
is chosen when ggserve.native is first imported, from GGSERVE_CPU_VARIANT.

    GGSERVE_CPU_VARIANT=zen4 python tests/cpu_variant_answers.py RECORDING.json SMOLLM2 GEMMA3
"""
import json
import pathlib
import sys

import ggserve.native
from ggserve.server.engine.engine import Engine, EngineConfig

from engine_helpers import generate


def main(recording: str, smollm2: str, gemma3: str) -> None:
    cases_of = json.load(open(recording))["models"]
    golden = json.loads((pathlib.Path(__file__).parent / "data" / "completions.json").read_text())["models"]
    answers = {"variant": ggserve.native.CPU_VARIANT, "models": {}}
    for model, path in (("smollm2", smollm2), ("gemma3", gemma3)):
        engine = Engine(EngineConfig(path, n_ctx=2048, n_batch=512, n_parallel=1, n_threads=2))
        try:
            answers["models"][model] = {}
            prompt_of = {case["key"]: case["prompt_ids"] for case in golden[model]}
            for case in cases_of[model]:
                engine.clear_cache()
                events = generate(engine, {"r": prompt_of[case["key"]]}, len(case["generated_ids"]))["r"]
                answers["models"][model][case["key"]] = [[e.token, e.top_logprobs] for e in events]
        finally:
            engine.close()
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:])
