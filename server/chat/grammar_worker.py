"""Grammar compilation in worker processes: bounded in time, a crash contained.

llguidance compiles a grammar in native code that recurses once per level of rule
nesting: 5,000 chained rules (`r0 ::= r1 | "0"`, `r1 ::= r2 | "0"`, ...) overflow an
8 MiB stack and kill the process, and llguidance's GBNF -> Lark conversion (Python)
takes minutes on 20,000 rules. So a request's grammar is converted and validated in a
worker process (`python -m ggserve.server.chat.grammar_worker`) that holds the
vocabulary: a compile that runs past its timeout has its worker killed, a worker that
dies takes only that request with it (a 400 either way), and a fresh worker replaces
it on the next compile.

The worker compiles on a thread with half the stack of the server's threads
(`worker_stack`): a grammar it accepts is built again in the server (each sequence's
matcher, server/chat/grammar.py) with twice the stack it needed here.

Frames on the pipes: a 4-byte big-endian length, then a pickle. The first frame to a
worker is its vocabulary; then each request (kind, text) is answered ("ok", source)
or ("error", message).
"""
from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time

START_TIMEOUT = 120.0            # seconds a new worker may take to build its vocabulary
_HEAD = struct.Struct(">I")


def worker_stack() -> int:
    """Half the stack a thread of this process gets: threading.stack_size()'s, else the
    soft RLIMIT_STACK (glibc's default for new threads), else 2 MiB."""
    import resource
    size = threading.stack_size()
    if not size:
        soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
        size = soft if 0 < soft < 2**40 else 2 * 2**20
    return max(size // 2, 512 * 1024)


class CompileFailed(Exception):
    """The grammar did not compile: the message says why (the request's 400)."""


def _write(f, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_HEAD.pack(len(data)) + data)
    f.flush()


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes:
    """n bytes from fd; TimeoutError past the deadline, EOFError when the writer is gone."""
    out = bytearray()
    while len(out) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, n - len(out))
        if not chunk:
            raise EOFError
        out += chunk
    return bytes(out)


def _read(fd: int, deadline: float | None):
    (n,) = _HEAD.unpack(_read_exact(fd, _HEAD.size, deadline))
    return pickle.loads(_read_exact(fd, n, deadline))


class _Worker:
    def __init__(self, vocab: dict):
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, close_fds=True)
        _write(self.proc.stdin, {**vocab, "stack": worker_stack()})
        if _read(self.proc.stdout.fileno(), time.monotonic() + START_TIMEOUT) != "ready":
            raise RuntimeError("grammar worker failed to start")

    def ask(self, request, timeout: float):
        _write(self.proc.stdin, request)
        return _read(self.proc.stdout.fileno(), time.monotonic() + timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class CompilePool:
    """Up to `size` workers for one vocabulary; `compile` blocks its caller only."""

    def __init__(self, vocab: dict, size: int = 2):
        self._vocab = vocab
        self._idle: list[_Worker] = []
        self._free = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()

    def compile(self, kind: str, text: str, timeout: float) -> str:
        """llguidance's grammar source for (kind, text); CompileFailed says why not."""
        if not self._free.acquire(timeout=timeout):
            raise CompileFailed(f"no grammar compiler was free within {timeout:g} s (--grammar-timeout)")
        try:
            worker = self._take()
            try:
                status, value = worker.ask((kind, text), timeout)
            except TimeoutError:
                self._drop(worker)
                raise CompileFailed(f"compiling the grammar took longer than {timeout:g} s "
                                    f"(--grammar-timeout)") from None
            except (EOFError, OSError, pickle.UnpicklingError, struct.error):
                self._drop(worker)
                raise CompileFailed("the grammar is too complex: its compiler failed "
                                    "(nesting too deep?)") from None
            self._put(worker)
            if status != "ok":
                raise CompileFailed(value)
            return value
        finally:
            self._free.release()

    def close(self) -> None:
        with self._lock:
            workers, self._idle = list(self._all), []
            self._all.clear()
        for w in workers:
            w.kill()

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        w = _Worker(self._vocab)
        with self._lock:
            self._all.add(w)
        return w

    def _put(self, w: _Worker) -> None:
        with self._lock:
            self._idle.append(w)

    def _drop(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._all.discard(w)


# -- the worker process -------------------------------------------------------------------

def _tokenizer(vocab: dict):
    import llguidance

    holder: list = []

    class Vocab:                 # llguidance's TokenizerWrapper protocol
        eos_token_id = vocab["eos"][0] if vocab["eos"] else None
        bos_token_id = vocab["bos"]
        tokens = vocab["tokens"]
        special_token_ids = vocab["special"]

        def __call__(self, text) -> list[int]:
            if isinstance(text, str):
                text = text.encode("utf-8")
            return holder[0].tokenize_bytes(text) if holder else []

    ll = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Vocab()), n_vocab=vocab["n_vocab"],
                                eos_token=vocab["eos"])
    holder.append(ll)
    return ll


def _compile(ll, kind: str, text: str) -> tuple[str, str]:
    """What server/chat/grammar.py's Constraint will do with the grammar, done here first."""
    from llguidance import LLMatcher, grammar_from
    try:
        src = grammar_from("json_schema" if kind == "json_schema" else "gbnf" if kind == "gbnf" else "lark", text)
    except (ValueError, TypeError, RecursionError) as e:
        return "error", f"invalid {kind}: {e}"
    err = LLMatcher.validate_grammar(src, ll)
    if err and not err.startswith("WARNING"):
        return "error", f"invalid {kind}: {err}"
    m = LLMatcher(ll, src, log_level=0)
    if m.is_error():
        return "error", f"invalid {kind}: {m.get_error()}"
    m.compute_bitmask()          # the first mask, as the first step will ask for it
    return "ok", src


def main() -> None:
    stdin, out = sys.stdin.buffer.fileno(), sys.stdout.buffer
    try:
        vocab = _read(stdin, None)
        ll = _tokenizer(vocab)
        _write(out, "ready")
        threading.stack_size(vocab["stack"])
        while True:
            kind, text = _read(stdin, None)
            result: list = []
            t = threading.Thread(target=lambda r=result, k=kind, x=text: r.append(_compile(ll, k, x)))
            t.start()
            t.join()
            _write(out, result[0] if result else ("error", f"invalid {kind}: the compiler failed"))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return


if __name__ == "__main__":
    main()
