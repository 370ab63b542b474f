"""What the engine checks of a request before it queues it, once."""
from __future__ import annotations

from ggserve.server.engine.sequence import Request
from ggserve.server.request_errors import ContextLengthExceeded


def check_request(request: Request, *, n_ctx: int, n_pos: int, n_vocab: int, n_batch: int,
                  embeddings: bool) -> None:
    """Raise ValueError (ContextLengthExceeded for a prompt too long) for a request
    the engine cannot run (sampling parameters check themselves when made)."""
    prompt = request.prompt
    if not prompt:
        raise ValueError("the prompt is empty")
    if request.embed and not embeddings:
        raise ValueError("embeddings are off: start the server with --embeddings")
    if len(prompt) + (0 if request.embed else 1) > n_ctx:
        raise ContextLengthExceeded(f"This model's maximum context length is {n_ctx} tokens "
                                    f"per sequence, but the prompt has {len(prompt)} tokens.")
    if request.max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    if request.positions is not None and request.positions.shape != (n_pos, len(prompt)):
        raise ValueError(f"positions must be [{n_pos}, {len(prompt)}] for this model")
    rows = {i for span in request.images for i in range(span.start, span.end)}
    bad = [t for i, t in enumerate(prompt) if i not in rows and not 0 <= t < n_vocab]
    if bad:
        raise ValueError(f"token id {bad[0]} is out of the vocabulary (0..{n_vocab - 1})")
    too_long = [s for s in request.images if s.bidirectional and s.n > n_batch]
    if too_long:
        raise ValueError(f"an image needs {too_long[0].n} tokens in one batch; the batch size is {n_batch}")
