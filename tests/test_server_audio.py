"""Audio through the real HTTP server with the openai SDK: `input_audio` parts answered as
llama-server 11434 answers them (synth-audio goldens: prompt tokens, greedy text up to the
first near tie, top-5 logprobs), two clips in one message, the embedding cache across
requests, and every bad input as a 400 naming the reason."""
import base64

import httpx
import jsonschema
import openai
import pytest
import synth_audio as SA
from server_harness import RunningServer

from ggserve.server.api.media import MediaConfig
from ggserve.server.app import ServerConfig, create_app

GREEDY = dict(temperature=0.0, top_p=1.0, seed=1234, logprobs=True, top_logprobs=5,
              extra_body={"top_k": 1, "min_p": 0.0, "repeat_penalty": 1.0, "cache_prompt": False})


def b64(name: str) -> str:
    return base64.b64encode(SA.clip_bytes(name)).decode()


def audio_part(name: str) -> dict:
    return {"type": "input_audio", "input_audio": {"data": b64(name), "format": name.rsplit(".", 1)[1]}}


def golden_messages(case: dict) -> list:
    """The golden request's messages with the clips' bytes put back."""
    parts = []
    for p in case["request"]["messages"][0]["content"]:
        if p["type"] == "input_audio":
            name = p["input_audio"]["data"].split(" ")[2]
            fmt = p["input_audio"]["format"]
            parts.append({"type": "input_audio", "input_audio": {"data": b64(name), "format": fmt}})
        else:
            parts.append(p)
    return [{"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def server():
    cfg = ServerConfig(model=str(SA.TEXT_MODEL), mmproj=SA.mmproj("ultravox"), n_ctx=4096, n_parallel=2,
                       n_batch=2048, n_threads=2, metrics=True, media=MediaConfig(audio_max_seconds=31))
    with RunningServer(create_app(cfg)) as srv:
        srv.model = httpx.get(srv.url + "/v1/models").json()["data"][0]["id"]
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


def assert_answer_as_llama_cpp(answer, case):
    assert answer.usage.prompt_tokens == case["prompt_tokens"]
    tie = SA.first_near_tie(case)
    steps = answer.choices[0].logprobs.content
    got = [s.bytes for s in steps]           # by bytes: a token that is part of a UTF-8 character has no text
    assert got[:tie] == [s["bytes"] for s in case["steps"]][:tie]
    worst = 0.0
    for ours, gold in list(zip(steps, case["steps"]))[:tie + 1]:
        mine = {tuple(t.bytes): t.logprob for t in ours.top_logprobs}
        for t in gold["top_logprobs"]:
            worst = max(worst, abs(mine[tuple(t["bytes"])] - t["logprob"]))
    assert worst <= SA.LOGPROB_TOL


@pytest.mark.parametrize("audio", ["speech_espeak_22k_mono.wav", SA.TWO])
def test_input_audio_answers_as_llama_server(client, server, audio):
    case = SA.case("ultravox", audio)
    answer = client.chat.completions.create(model=server.model, messages=golden_messages(case),
                                            max_tokens=len(case["generated_ids"]), **GREEDY)
    assert_answer_as_llama_cpp(answer, case)


def test_same_clip_again_skips_the_encoder(client, server):
    msg = [{"role": "user", "content": [audio_part("tone_16k_mono_1s.wav"), {"type": "text", "text": "Again?"}]}]
    first = client.chat.completions.create(model=server.model, messages=msg, max_tokens=4, temperature=0)
    misses = server.metric("ggserve_image_cache_misses_total")
    hits = server.metric("ggserve_image_cache_hits_total")
    # text before the clip: no cached prefix covers it, only the embedding cache can
    msg2 = [{"role": "user", "content": [{"type": "text", "text": "Listen."}, audio_part("tone_16k_mono_1s.wav")]}]
    second = client.chat.completions.create(model=server.model, messages=msg2, max_tokens=4, temperature=0)
    assert server.metric("ggserve_image_cache_misses_total") == misses
    assert server.metric("ggserve_image_cache_hits_total") == hits + 1
    again = client.chat.completions.create(model=server.model, messages=msg, max_tokens=4, temperature=0)
    assert again.choices[0].message.content == first.choices[0].message.content
    assert second.choices[0].message.content is not None


BAD = {
    "not_audio": ({"data": base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(64)).decode(), "format": "wav"},
                  "not a WAV, MP3 or FLAC"),
    "unsupported_format": ({"data": "AAAA", "format": "ogg"}, "Unsupported audio format"),
    "bad_base64": ({"data": "!!!not base64!!!", "format": "wav"}, "Invalid base64"),
    "no_data": ({"format": "wav"}, "needs `data`"),
    "truncated_wav": ({"data": base64.b64encode(SA.clip_bytes("tone_16k_mono_1s.wav")[:40]).decode(),
                       "format": "wav"}, "Could not decode"),
    "too_long": ({"data": b64("long_16k_mono_35s.wav"), "format": "wav"}, "--audio-max-seconds"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_audio_is_a_400_and_the_server_keeps_serving(server, client, case):
    part, reason = BAD[case]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": part}]}], "max_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and reason in err["message"]
    assert err["param"] == "messages.0.content.0.input_audio"
    ok = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert ok.choices[0].message.content is not None


def test_audio_to_a_server_without_an_audio_encoder_is_a_400(smollm2_path):
    with RunningServer(create_app(ServerConfig(model=smollm2_path, n_ctx=1024, n_parallel=1, n_threads=2))) as srv:
        r = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": [audio_part("tone_16k_mono_1s.wav")]}], "max_tokens": 2})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "audio_not_supported"
        assert "does not support audio" in r.json()["error"]["message"]


# /v1/audio/transcriptions --------------------------------------------------------------

def transcribe(client, server, fmt: str, **kw):
    return client.audio.transcriptions.create(
        model="synth", file=("speech_espeak_22k_mono.wav", SA.clip_bytes("speech_espeak_22k_mono.wav"), "audio/wav"),
        response_format=fmt, temperature=0, extra_body={"max_tokens": 16}, **kw)


def test_transcription_json_answers_as_llama_server(client, server):
    gold = SA.config("ultravox")["transcription"]["response"]
    got = transcribe(client, server, "json")
    assert got.text == gold["text"]
    assert got.usage.input_tokens == gold["usage"]["input_tokens"]
    assert got.usage.output_tokens == gold["usage"]["output_tokens"]


def test_transcription_text_is_the_plain_text(client, server):
    gold = SA.config("ultravox")["transcription"]["response"]["text"]
    assert transcribe(client, server, "text") == gold


def test_transcription_verbose_json_has_one_segment_over_the_clip(client, server):
    gold = SA.config("ultravox")["transcription"]["response"]["text"]
    got = transcribe(client, server, "verbose_json", language="en")
    assert (got.language, got.duration) == ("en", 6.131)     # 98092 samples at 16 kHz
    assert len(got.segments) == 1 and (got.segments[0].start, got.segments[0].end) == (0.0, 6.131)
    assert got.segments[0].text == got.text != gold     # the language is in the prompt: another answer


@pytest.mark.parametrize("fmt, first_line", [("srt", "1"), ("vtt", "WEBVTT")])
def test_transcription_subtitles_span_the_clip(client, server, fmt, first_line):
    gold = SA.config("ultravox")["transcription"]["response"]["text"]
    sep = "," if fmt == "srt" else "."
    lines = transcribe(client, server, fmt).split("\n")
    assert lines[0] == first_line
    assert f"00:00:00{sep}000 --> 00:00:06{sep}131" in lines
    assert gold.strip() in lines


def test_transcription_streams_deltas_then_the_text(client, server):
    gold = SA.config("ultravox")["transcription"]["response"]["text"]
    events = list(transcribe(client, server, "json", stream=True))
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert "".join(e.delta for e in events[:-1]) == gold
    assert events[-1].type == "transcript.text.done" and events[-1].text == gold


@pytest.mark.parametrize("form, status, reason", [
    ({"model": "synth"}, 400, "No input file"),
    ({"model": "synth", "response_format": "xml"}, 400, "response_format"),
])
def test_bad_transcription_forms_are_400s(server, form, status, reason):
    files = {"file": ("a.wav", SA.clip_bytes("tone_16k_mono_1s.wav"), "audio/wav")} if "xml" in str(form) else None
    r = httpx.post(server.url + "/v1/audio/transcriptions", data=form, files=files, timeout=60)
    assert r.status_code == status and reason in r.json()["error"]["message"]


def test_transcription_of_a_non_audio_file_is_a_400(server):
    r = httpx.post(server.url + "/audio/transcriptions", data={"model": "synth"}, timeout=60,
                   files={"file": ("a.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"


def test_transcription_answers_as_its_openapi_operation_documents(server):
    op = httpx.get(server.url + "/openapi.json").json()["paths"]["/v1/audio/transcriptions"]["post"]
    form = op["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert form["required"] == ["file"]
    r = httpx.post(server.url + "/v1/audio/transcriptions", data={"model": "synth", "max_tokens": "2"}, timeout=120,
                   files={"file": ("a.flac", SA.clip_bytes("chord_32k_stereo_2s.flac"), "audio/flac")})
    assert r.status_code == 200
    jsonschema.Draft202012Validator(op["responses"]["200"]["content"]["application/json"]["schema"]).validate(r.json())


def test_responses_api_takes_input_audio_as_chat_does(client, server):
    msgs = [{"role": "user", "content": [audio_part("tone_16k_mono_1s.wav"), {"type": "text", "text": "Hear?"}]}]
    chat = client.chat.completions.create(model=server.model, messages=msgs, max_tokens=4, temperature=0)
    clip = audio_part("tone_16k_mono_1s.wav")["input_audio"]
    got = client.responses.create(model=server.model, max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_audio", "input_audio": clip},
                                     {"type": "input_text", "text": "Hear?"}]}])
    assert got.output_text == chat.choices[0].message.content
    assert got.usage.input_tokens == chat.usage.prompt_tokens


def test_native_completion_takes_multimodal_data_as_llama_server(server):
    """/completion's {prompt_string, multimodal_data}: the golden chat's rendered prompt with the
    clip gives the golden's prompt tokens and greedy tokens (up to the first near tie)."""
    case = SA.case("ultravox", "speech_espeak_22k_mono.wav")
    r = httpx.post(server.url + "/completion", timeout=300, json={
        "prompt": {"prompt_string": case["apply_template_prompt"], "multimodal_data": [b64(case["audio"])]},
        "n_predict": len(case["generated_ids"]), "temperature": 0, "return_tokens": True, "cache_prompt": False})
    assert r.status_code == 200, r.text
    got = r.json()
    tie = SA.first_near_tie(case)
    assert got["tokens_evaluated"] == case["prompt_tokens"]
    assert got["tokens"][:tie] == case["generated_ids"][:tie]


def test_native_completion_with_more_media_than_markers_is_a_400(server):
    r = httpx.post(server.url + "/completion", timeout=60, json={"n_predict": 1, "prompt": {
        "prompt_string": "no marker here", "multimodal_data": [b64("tone_16k_mono_1s.wav")]}})
    assert r.status_code == 400 and "marker" in r.json()["error"]["message"]


def test_audio_over_audio_max_bytes_is_a_400_everywhere():
    """--audio-max-bytes, by a server whose limit is below the clip (32,044 bytes)."""
    cfg = ServerConfig(model=str(SA.TEXT_MODEL), mmproj=SA.mmproj("ultravox"), n_ctx=4096, n_parallel=1,
                       n_threads=2, media=MediaConfig(audio_max_bytes=30_000))
    with RunningServer(create_app(cfg)) as srv:
        chat = httpx.post(srv.url + "/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": [audio_part("tone_16k_mono_1s.wav")]}], "max_tokens": 1})
        asr = httpx.post(srv.url + "/v1/audio/transcriptions", data={"model": "x"}, timeout=60,
                         files={"file": ("a.wav", SA.clip_bytes("tone_16k_mono_1s.wav"), "audio/wav")})
        native = httpx.post(srv.url + "/completion", timeout=60, json={"n_predict": 1, "prompt": {
            "prompt_string": "<__media__>", "multimodal_data": [b64("tone_16k_mono_1s.wav")]}})
        for r in (chat, asr, native):
            assert r.status_code == 400 and "--audio-max-bytes" in r.json()["error"]["message"]
