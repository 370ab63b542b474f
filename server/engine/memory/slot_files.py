"""Slot files (`POST /slots/{id}?action=save|restore`, `--slot-save-path`): a slot's
memory snapshot (server/engine/memory/snapshot.py) on disk, in a format of our own.

    magic      8 bytes  b"GGSVSLOT"
    version    u32 LE   FORMAT_VERSION
    header     u32 LE length, then that many bytes of JSON:
               {"model": fingerprint, "layout": cache layout, "n_tokens": n,
                "states": [positions], "body_sha256": hex,
                "cache_salt": the slot's salt, only when it has one (Snapshot.salt)}
    body       tokens int32[n], positions int32[n_pos, n], span ids int64[n],
               then per attention layer its K rows, then its V rows (n rows each),
               then per state position (recurrent layers) one row per state tensor,
               then with a sliding-window ring ("ring_cells": m in the header) its
               cells in ring order: positions int32[m], span ids int64[m], per ring
               layer its K rows, then its V rows (m rows each)

A file is read back only when every part checks out against the running model: the
magic and version, the fingerprint (architecture, tensor names/types/shapes, file
size and sampled weight bytes: another GGUF is refused), the layout (cache types,
row sizes, positions per token), the token count, the exact file size, and the
body's sha256 (a flipped byte is refused, not computed with). Anything else is a
SlotFileError (a 400). File names are plain names inside the folder: no
separators, no leading dot, no links followed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import struct

import numpy as np

from ggserve.server.engine.memory.snapshot import RingRows, Snapshot
from ggserve.server.request_errors import RequestError

MAGIC = b"GGSVSLOT"
FORMAT_VERSION = 1
MAX_HEADER = 1 << 16
MAX_RING_CELLS = 1 << 24      # more than any ring holds (a ring restored into one too small: no room)
MAX_STATES = 1024             # state positions per file (a slot keeps its live state and its --ctx-checkpoints)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_SAMPLES = 16                 # weight bytes sampled for the fingerprint: 16 x 4 KiB
_SAMPLE_BYTES = 4096


class SlotFileError(RequestError):
    param = "filename"


def model_fingerprint(gguf) -> str:
    """sha256 of what makes a GGUF this model: architecture, tensor infos, file size
    and a few KiB of weights spread over the file (reading it all would take seconds)."""
    h = hashlib.sha256()
    h.update(str(gguf.architecture).encode())
    for name, info in sorted(gguf.tensors.items()):
        h.update(f"{name}:{info.ggml_type}:{tuple(info.ne)};".encode())
    size = os.path.getsize(gguf.path)
    h.update(str(size).encode())
    with open(gguf.path, "rb") as f:
        for i in range(_SAMPLES):
            f.seek(gguf.data_offset + (size - gguf.data_offset) * i // _SAMPLES)
            h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()


def path_in(folder: str, filename) -> str:
    """folder/filename for a plain file name; SlotFileError for anything else."""
    if not isinstance(filename, str) or not _NAME.fullmatch(filename) or ".." in filename:
        raise SlotFileError("filename must be a plain file name (letters, digits, '.', '_', '-'; "
                            "no path, no leading dot)")
    return os.path.join(folder, filename)


def _body(snap: Snapshot) -> list:
    parts = [np.asarray(snap.tokens, dtype="<i4").tobytes(), snap.positions.astype("<i4").tobytes(),
             snap.spans.astype("<i8").tobytes()]
    for k, v in zip(snap.k, snap.v):
        if k is not None:
            parts += [k, v]
    for p in sorted(snap.states or {}):
        parts += snap.states[p]
    if snap.ring is not None:
        parts += [snap.ring.positions.astype("<i4").tobytes(), snap.ring.spans.astype("<i8").tobytes()]
        parts += [b for k, v in zip(snap.ring.k, snap.ring.v) if k is not None for b in (k, v)]
    return parts


def save(path: str, snap: Snapshot, model: str, layout: dict) -> int:
    """Write snap to path (through a temporary file, so a reader never sees half a
    file). -> bytes written."""
    body = _body(snap)
    digest = hashlib.sha256()
    for p in body:
        digest.update(p)
    header = json.dumps({"model": model, "layout": layout, "n_tokens": snap.n,
                         "states": sorted(snap.states or {}), "body_sha256": digest.hexdigest(),
                         **({"cache_salt": snap.salt} if snap.salt else {}),
                         **({"ring_cells": len(snap.ring.positions)} if snap.ring is not None else {})}).encode()
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        raise SlotFileError(f"cannot write slot file {os.path.basename(path)!r}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header)
            for p in body:
                f.write(p)
            n = f.tell()
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError):          # a folder of that name, a full disk
            raise SlotFileError(f"cannot write slot file {os.path.basename(path)!r}: {e.strerror}") from None
        raise
    return n


def load(path: str, model: str, layout: dict, max_tokens: int) -> Snapshot:
    """Read and check a slot file written by save() for this model and cache layout."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SlotFileError(f"no slot file {os.path.basename(path)!r}") from None
    except OSError as e:
        raise SlotFileError(f"cannot open slot file {os.path.basename(path)!r}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(16)
        if len(head) < 16 or head[:8] != MAGIC:
            raise SlotFileError("not a ggserve slot file")
        version, n_header = struct.unpack("<II", head[8:])
        if version != FORMAT_VERSION:
            raise SlotFileError(f"slot file format version {version}; this server reads {FORMAT_VERSION}")
        if n_header > MAX_HEADER:
            raise SlotFileError("slot file header is too large")
        header = _header(f.read(n_header), n_header)
        if header.get("model") != model:
            raise SlotFileError("the slot file was saved with another model")
        if header.get("layout") != layout:
            raise SlotFileError("the slot file was saved with another KV cache layout "
                                f"({header.get('layout')!r}; this server: {layout!r})")
        n = header.get("n_tokens")
        if not isinstance(n, int) or isinstance(n, bool) or not 0 < n <= max_tokens:
            raise SlotFileError(f"the slot file holds {n!r} tokens; a slot holds 1..{max_tokens}")
        salt = header.get("cache_salt", "")
        if not isinstance(salt, str):
            raise SlotFileError("the slot file's cache_salt is not a string")
        points = _state_points(header.get("states"), n, bool(layout["recurrent"]))
        m = _ring_cells(header.get("ring_cells"), "ring" in layout)
        sizes = _sizes(layout, n, len(points), m)
        if size != 16 + n_header + sum(sizes):
            raise SlotFileError(f"the slot file is {size} bytes; its header says "
                                f"{16 + n_header + sum(sizes)} (truncated or padded)")
        parts = [f.read(s) for s in sizes]
    digest = hashlib.sha256()
    for p in parts:
        digest.update(p)
    if digest.hexdigest() != header.get("body_sha256"):
        raise SlotFileError("the slot file is corrupt (checksum mismatch)")
    n_pos = layout["n_pos"]
    tokens = tuple(int(t) for t in np.frombuffer(parts[0], dtype="<i4"))
    positions = np.frombuffer(parts[1], dtype="<i4").reshape(n_pos, n).astype(np.int32)
    spans = np.frombuffer(parts[2], dtype="<i8").astype(np.int64)
    k, v, i = [], [], 3
    for rows in layout["rows"]:
        if rows is None:
            k.append(None)
            v.append(None)
        else:
            k.append(parts[i])
            v.append(parts[i + 1])
            i += 2
    per_point = len(layout["recurrent"])
    states = {p: parts[i + j * per_point:i + (j + 1) * per_point] for j, p in enumerate(points)} \
        if layout["recurrent"] else None
    return Snapshot(tokens, positions, spans, k, v, states, salt,
                    _ring(layout, parts[i + len(points) * per_point:], m) if m else None)


def _ring(layout: dict, parts: list, m: int) -> RingRows:
    """The ring's part of a body (parts from its positions on)."""
    k, v, i = [], [], 2
    for rows in layout["ring"]:
        k.append(None if rows is None else parts[i])
        v.append(None if rows is None else parts[i + 1])
        i += 0 if rows is None else 2
    return RingRows(np.frombuffer(parts[0], dtype="<i4").astype(np.int32),
                    np.frombuffer(parts[1], dtype="<i8").astype(np.int64), k, v, layout["ring_window"])


def _ring_cells(m, ring: bool) -> int:
    """The header's ring cell count, checked: with a ring, 1 or more; 0 (absent) without."""
    if not ring:
        if m is not None:
            raise SlotFileError("the slot file holds sliding-window ring cells; this server keeps no ring")
        return 0
    if not isinstance(m, int) or isinstance(m, bool) or not 0 < m <= MAX_RING_CELLS:
        raise SlotFileError(f"the slot file's ring cell count {m!r} is not in 1..{MAX_RING_CELLS}")
    return m


def _state_points(points, n: int, recurrent: bool) -> list:
    """The header's state positions, checked: for a recurrent model, at least one,
    ascending, each in 1..n; none otherwise."""
    if not isinstance(points, list) or not all(isinstance(p, int) and not isinstance(p, bool) for p in points):
        raise SlotFileError("the slot file's state positions are not a list of integers")
    if recurrent != bool(points) or points != sorted(set(points)) or any(not 0 < p <= n for p in points) \
            or len(points) > MAX_STATES:
        raise SlotFileError(f"the slot file's state positions {points[:8]!r} do not fit {n} tokens")
    return points


def _header(raw: bytes, n_header: int) -> dict:
    if len(raw) != n_header:
        raise SlotFileError("the slot file is truncated (header)")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise SlotFileError("the slot file header is not valid JSON") from None
    if not isinstance(header, dict):
        raise SlotFileError("the slot file header is not a JSON object")
    return header


def _sizes(layout: dict, n: int, n_states: int, m: int = 0) -> list:
    """Byte sizes of the body's parts for n tokens, n_states state positions and m ring cells."""
    sizes = [4 * n, 4 * layout["n_pos"] * n, 8 * n]
    for rows in layout["rows"]:
        if rows is not None:
            sizes += [rows[0] * n, rows[1] * n]
    sizes += list(layout["recurrent"]) * n_states
    if m:
        sizes += [4 * m, 8 * m]
        sizes += [b * m for rows in layout["ring"] if rows is not None for b in rows]
    return sizes
