"""read_file, write_file and edit_file, as llama-server answers them."""
from __future__ import annotations

import base64

from ggserve.server.agent_tools.edits import apply_edits
from ggserve.server.agent_tools.errors import ToolError

READ_MAX_BYTES = 16 * 1024
READ_MAX_BYTES_BASE64 = 32 * 2**20


async def read_file(io, params: dict) -> dict:
    path = params["path"]
    start, end = int(params.get("start_line", 1)), int(params.get("end_line", -1))
    size = await io.size(path)
    if size is None:
        raise ToolError(f"cannot stat file: {path}")
    if params.get("resp_type") == "base64":          # from the x-resp-type header, never the model
        if size > READ_MAX_BYTES_BASE64:
            raise ToolError(f"file too large ({size} bytes, max {READ_MAX_BYTES_BASE64})")
        data = await _read(io, path)
        return {"base64": base64.b64encode(data).decode("ascii"), "size_bytes": len(data)}
    if size > READ_MAX_BYTES and end == -1:
        raise ToolError(f"file too large ({size} bytes, max {READ_MAX_BYTES}). "
                        "Use start_line/end_line to read a portion.")
    lines = (await _read(io, path)).decode("utf-8", "replace").split("\n")
    if lines[-1] == "":
        lines.pop()
    out, used = [], 0
    for number, line in enumerate(lines, 1):
        if number < start:
            continue
        if end != -1 and number > end:
            break
        piece = f"{number}\u2192{line}\n" if params.get("append_loc") else f"{line}\n"
        if used + len(piece.encode()) > READ_MAX_BYTES:
            out.append("[output truncated]")
            break
        out.append(piece)
        used += len(piece.encode())
    return {"plain_text_response": "".join(out)}


async def _read(io, path: str) -> bytes:
    data = await io.read(path)
    if data is None:
        raise ToolError(f"failed to open file: {path}")
    return data


async def write_file(io, params: dict) -> dict:
    path, content = params["path"], params["content"]
    if not isinstance(content, str):
        raise ToolError('"content" must be a string')
    data = content.encode()
    if not await io.write(path, data):
        raise ToolError(f"failed to write file: {path}")
    return {"result": "file written successfully", "path": path, "bytes": len(data)}


async def edit_file(io, params: dict) -> dict:
    path, edits = params["path"], params.get("edits")
    if not isinstance(edits, list) or not edits:
        raise ToolError('"edits" must be a non-empty array')
    pairs = []
    for i, e in enumerate(edits):
        if not isinstance(e, dict) or not isinstance(e.get("old_text"), str) or not isinstance(e.get("new_text"), str):
            raise ToolError(f"edits[{i}] needs old_text and new_text strings")
        if not e["old_text"]:
            raise ToolError(f"edits[{i}].old_text must not be empty")
        pairs.append((e["old_text"], e["new_text"]))
    original = (await _read(io, path)).decode("utf-8", "surrogateescape")
    changed = apply_edits(original, pairs, path)
    if not await io.write(path, changed.encode("utf-8", "surrogateescape")):
        raise ToolError(f"failed to write file: {path}")
    return {"result": "file edited successfully", "path": path, "edits_applied": len(pairs)}
