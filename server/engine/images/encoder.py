"""Image tiles encoded on a worker thread while text steps go on.

The vision model gets a ggml backend of its own (its own scheduler and compute
buffers), so its graph can run on a second thread while the engine computes
text steps: ggml releases the GIL while it computes. One tile at a time; results
are collected on the engine's thread, which owns the image store.

In the background a tile gets one CPU thread and the text steps the others. A
tile that nothing else can run beside is encoded on the engine's own thread with
every thread: a multi-threaded ggml graph on the worker thread (a second OpenMP
team) left later text steps on the engine's thread ~1.7x slower (measured on
2 cores: decode 21 -> 37 ms per token), and one thread beside them did not.
"""
from __future__ import annotations

import concurrent.futures

BACKGROUND_THREADS = 1     # CPU threads of a tile encoding beside text steps


class ImageEncoder:
    def __init__(self, vision, device, n_threads: int):
        self.vision = vision          # VisionModel on its own Backend
        self.device = device          # where embeddings are kept (the first text layer's)
        self.n_threads = max(1, n_threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ggserve-vision")
        self._key = None
        self._future: concurrent.futures.Future | None = None

    @property
    def key(self):
        """The key of the tile in flight (or done, not collected yet)."""
        return self._key

    def busy(self) -> bool:
        """A tile is encoding now."""
        return self._future is not None and not self._future.done()

    def idle(self) -> bool:
        """Nothing in flight and nothing left to collect."""
        return self._future is None

    def start(self, key, tile) -> None:
        """Encode one tile in the background (the previous one must be collected)."""
        assert self._future is None, "collect the finished tile first"
        self.vision.backend.set_n_threads(BACKGROUND_THREADS)
        self._key = key
        self._future = self._pool.submit(self.vision.encode_on, tile, self.device)

    def collect(self, wait: bool = False):
        """(key, embedding buffer) of the tile in flight once it is done (waiting for
        it with wait=True), else None. An encoding error is raised here."""
        if self._future is None or not (wait or self._future.done()):
            return None
        key, future = self._key, self._future
        self._key = self._future = None
        return key, future.result()

    def encode_now(self, tile):
        """Encode a tile on the calling thread with every thread (after any tile in
        flight: one vision graph at a time)."""
        if self._future is not None:
            self._future.exception()          # wait; its result stays to be collected
        self.vision.backend.set_n_threads(self.n_threads)
        return self.vision.encode_on(tile, self.device)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._future = None
