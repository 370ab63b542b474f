"""Image tiles encoded on a worker thread while text steps go on.

The vision model gets a ggml backend of its own (its own scheduler and compute
buffers), so its graph can run on a second thread while the engine computes
text steps: ggml releases the GIL while it computes. One tile at a time; results
are collected on the engine's thread, which owns the image store.

On the CPU the two share the cores: while a tile encodes beside text steps, the
encoder takes half the threads and the text steps the rest (two pools of n
threads each on n cores run both slower than this split). A tile that nothing
else can run beside gets every thread.
"""
from __future__ import annotations

import concurrent.futures


class ImageEncoder:
    def __init__(self, vision, device, n_threads: int):
        self.vision = vision          # VisionModel on its own Backend
        self.device = device          # where embeddings are kept (the first text layer's)
        self.n_threads = max(1, n_threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="ggserve-vision")
        self._key = None
        self._future: concurrent.futures.Future | None = None

    @property
    def shared_threads(self) -> int:
        """Threads the encoder takes while text steps run beside it."""
        return max(1, self.n_threads // 2) if self.n_threads > 1 else 1

    def busy(self) -> bool:
        return self._future is not None and not self._future.done()

    def start(self, key, tile, beside_text: bool) -> None:
        """Encode one tile in the background (the previous one must be collected)."""
        assert self._future is None, "collect the finished tile first"
        self.vision.backend.set_n_threads(self.shared_threads if beside_text else self.n_threads)
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
        """Encode a tile and wait for it (after any tile in flight: one graph at a time)."""
        if self._future is not None:
            self._future.exception()          # wait; its result stays to be collected
        self.vision.backend.set_n_threads(self.n_threads)
        return self._pool.submit(self.vision.encode_on, tile, self.device).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._future = None
