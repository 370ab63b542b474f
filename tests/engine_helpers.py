"""Running the engine to completion, for tests (no server involved)."""
from ggserve.server.chat.turns import turn_cuts
from ggserve.server.engine.engine import Engine, Request
from ggserve.server.chat.prompts import PromptBuilder
from ggserve.server.engine.sampling.sampler import SamplingParams

GREEDY = SamplingParams(temperature=0.0, top_k=1, n_probs=10)


def generate(engine: Engine, prompts: dict[str, list[int]], max_tokens: int,
             params: SamplingParams = GREEDY) -> dict[str, list]:
    """Run every prompt (id -> token ids) together; return id -> list of TokenEvents."""
    return generate_requests(engine, [Request(rid, list(ids), params, max_tokens=max_tokens, ignore_eos=True)
                                      for rid, ids in prompts.items()])


def generate_requests(engine: Engine, requests: list[Request]) -> dict[str, list]:
    """Run these requests together; return id -> list of TokenEvents."""
    for r in requests:
        engine.add(r)
    events: dict[str, list] = {r.id: [] for r in requests}
    while engine.has_work():
        for ev in engine.step():
            events[ev.request_id].append(ev)
    return events


def tokens(events) -> list[int]:
    return [e.token for e in events if e.token is not None]


def max_logprob_deviation(events, steps) -> float:
    """Largest |ours - llama.cpp| over the top-5 logprobs of the golden steps, up to and
    including the first step where the chosen tokens differ (after it the contexts do).
    Fails when a token of llama.cpp's top-5 is missing from our top-10."""
    worst = 0.0
    for ev, step in zip(events, steps):
        if step["probs_available"]:
            mine = dict(ev.top_logprobs)
            for tid, lp in step["top_logprobs"]:
                assert tid in mine, f"token {tid} of llama.cpp's top-5 is not in our top-10"
                worst = max(worst, abs(mine[tid] - lp))
        if ev.token != step["id"]:
            break
    return worst


def build_prompt(engine: Engine, text: str, images=()) -> tuple[list[int], list]:
    """Rendered chat text + (sha256, image) pairs -> (tokens, image spans), as the
    server's prompt builder makes them."""
    prompt = PromptBuilder.for_engine(engine).build(text, list(images))
    return prompt.tokens, prompt.images


def turn_starts(engine: Engine, prompt: list[int], spans=()) -> tuple[int, ...]:
    """Where llama-server starts a batch at a user message (chats of models with context checkpoints)."""
    return turn_cuts(prompt, spans, PromptBuilder.for_engine(engine).delimiters)
