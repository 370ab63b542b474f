"""Synthetic audio mmproj files of families beyond the synth-audio set, and llama-server's answers
on them: tests/test_audio_synth.py's goldens for Music Flamingo (`musicflamingo`) and GLM-ASR (`glma`).

    python tests/data/audio/make_audio_family.py mmproj FAMILY OUT.gguf     (the tests make it in a temp dir)
    python tests/data/audio/make_audio_family.py record LLAMA_SERVER OUT.gguf answers.json

`mmproj`: the synth-audio generator's Whisper encoder (../shared/golden/tools/make_synth_audio.py,
same per-tensor seeding, same sizes as its qwen2a file) with the family's projector:
musicflamingo: mm.a.mlp.1 (+b) -> GELU-erf -> mm.a.mlp.2 (+b), after the encoder's 2x average pool;
glma: mm.a.norm_pre (LayerNorm) -> 4 frames stacked -> mm.a.mlp.1 (+b) -> GELU-erf -> mm.a.mlp.2 (+b),
between the learned rows v.boi and v.eoi.
`record`: llama-server -m synth-llama-smolvocab-audio.gguf --mmproj OUT.gguf -t 2 -c 4096 -np 1, and the
synth-audio golden's chat request (its request defaults, "Describe this audio.", max_tokens 16,
top_logprobs 5) for each clip named below: prompt tokens, generated ids and the top-5 logprobs.
"""
import base64
import json
import pathlib
import subprocess
import sys
import time

GOLDEN = pathlib.Path(__file__).resolve().parents[4] / "shared" / "golden"
SYNTH = GOLDEN / "synth-audio"
CLIPS = ["tone_16k_mono_1s.wav", "speech_espeak_22k_mono_64k.mp3", "long_16k_mono_35s.wav"]
BASE = dict(n_mel=128, n_embd=64, n_head=2, n_ff=128, n_layer=2, eps=1e-5, proj_hidden=128)
CFGS = {"musicflamingo": dict(BASE, projector_type="musicflamingo"),
        "glma": dict(BASE, projector_type="glma", stack_factor=4)}
KEYS = {"musicflamingo": "music_flamingo", "glma": "glma"}      # the tensors' seed key


def write_mmproj(path, family="musicflamingo"):
    sys.path.insert(0, str(GOLDEN / "tools"))
    import make_synth_audio as A
    import numpy as np

    cfg = CFGS[family]
    w = A.GGUFWriter(path, arch="clip")
    t = A.Tensors(KEYS[family])
    E, H, T = cfg["n_embd"], cfg["proj_hidden"], 64
    A.whisper_encoder(t, cfg)
    E_in = E * cfg.get("stack_factor", 1)
    if family == "glma":
        t.norm("mm.a.norm_pre.weight", E)
        t.bias("mm.a.norm_pre.bias", E)
    t.normal("mm.a.mlp.1.weight", (H, E_in), std=1 / np.sqrt(E_in))
    t.bias("mm.a.mlp.1.bias", H)
    t.normal("mm.a.mlp.2.weight", (T, H), std=A.TARGET_RMS / (0.65 * np.sqrt(H)))
    t.bias("mm.a.mlp.2.bias", T, std=0.005)
    if family == "glma":
        t.normal("v.boi", (1, T), std=A.TARGET_RMS, kind="f32")
        t.normal("v.eoi", (1, T), std=A.TARGET_RMS, kind="f32")
    A.audio_header(w, KEYS[family], cfg, T)
    A.write_tensors(w, t)
    A.finish(w)


def record(server_bin, mmproj, out):
    import httpx

    doc = json.loads((SYNTH / "out" / "audio_chat.json").read_text())
    port = 18531
    cmd = [server_bin, "-m", str(SYNTH / "models" / "synth-llama-smolvocab-audio.gguf"), "--mmproj", mmproj,
           "-t", "2", "-c", "4096", "-np", "1", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        results = []
        for clip in CLIPS:
            fmt = clip.rsplit(".", 1)[1]
            body = {**doc["request_defaults"], "messages": [{"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": base64.b64encode((SYNTH / "audio" / clip).read_bytes())
                                                        .decode(), "format": fmt}},
                {"type": "text", "text": doc["user_text"]}]}]}
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=600).json()
            steps = [{"id": s["id"], "token": s["token"], "logprob": s["logprob"],
                      "top_logprobs": [{"id": t["id"], "logprob": t["logprob"]} for t in s["top_logprobs"]]}
                     for s in r["choices"][0]["logprobs"]["content"]]
            results.append({"audio": clip, "prompt_tokens": r["usage"]["prompt_tokens"],
                            "generated_ids": [s["id"] for s in steps], "steps": steps})
        import hashlib
        sha = hashlib.sha256(pathlib.Path(mmproj).read_bytes()).hexdigest()
        pathlib.Path(out).write_text(json.dumps({"made_by": "tests/data/audio/make_audio_family.py record",
                                                 "mmproj_sha256": sha, "server_command": " ".join(cmd[1:]),
                                                 "results": results}, indent=1))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "mmproj":
        write_mmproj(sys.argv[3], sys.argv[2])
    else:
        record(sys.argv[2], sys.argv[3], sys.argv[4])
