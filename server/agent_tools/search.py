"""file_glob_search and grep_search, with llama-server's globs, limits and output."""
from __future__ import annotations

import asyncio
import functools
import re

from ggserve.server.agent_tools.errors import ToolError

FILE_SEARCH_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100


@functools.lru_cache(maxsize=256)
def _glob_regex(pattern: str) -> re.Pattern:
    """llama.cpp's glob_match: `*` and `?` stop at '/', `**` crosses it, `[...]` a class."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2 if pattern[i + 1:i + 2] in ("]", "-") else i + 1)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                body = "^" + body[1:] if body[:1] in ("!", "^") else body
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out), re.DOTALL)


def glob_match(pattern: str, text: str) -> bool:
    return _glob_regex(pattern).fullmatch(text) is not None


def path_glob_match(pattern: str, rel: str) -> bool:
    """No '/' in pattern: it matches the basename at any depth; else the whole relative path,
    anchored with '**/' unless it starts with '**' or '/'."""
    if "/" not in pattern:
        return glob_match(pattern, rel.rsplit("/", 1)[-1])
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel)
    return glob_match("**/" + pattern, rel)


def _selected(rel: str, include: str, exclude: str) -> bool:
    return path_glob_match(include, rel) and not (exclude and path_glob_match(exclude, rel))


async def file_glob_search(io, params: dict) -> dict:
    path = params["path"]
    include, exclude = params.get("include") or "**", params.get("exclude") or ""
    kind, max_depth = params.get("type", "file"), max(0, int(params.get("max_depth", 0)))
    limit = int(params.get("limit", FILE_SEARCH_MAX_RESULTS))
    if limit < 1:
        raise ToolError(f"invalid limit: {limit} (expected 1 or more)")
    if kind not in ("file", "dir", "all"):
        raise ToolError(f'invalid type: {kind} (expected "file", "dir" or "all")')
    base = io.path(path)
    listing = await io.list_entries(base, max_depth, kind)
    if listing is None:
        raise ToolError(f"path does not exist or is not a directory: {path}")
    matches = [(rel, is_dir) for rel, is_dir in listing.entries if _selected(rel, include, exclude)]
    shown = matches[:min(limit, FILE_SEARCH_MAX_RESULTS)]
    text = "".join(f"{rel}{'/' if is_dir else ''}\n" for rel, is_dir in shown)
    text += f"\n---\nTotal matches: {len(matches)}\n"
    if len(matches) > len(shown):
        text += (f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                 "Refine the glob pattern to narrow the search.]\n")
    if listing.truncated:
        text += "[results truncated: time budget or unreadable directory]\n"
    return {"plain_text_response": text,
            "entries": [{"path": rel, "type": "dir" if is_dir else "file"} for rel, is_dir in shown],
            "base": base}


async def grep_search(io, params: dict) -> dict:
    path, pattern = params["path"], params["pattern"]
    include, exclude = params.get("include") or "**", params.get("exclude") or ""
    context = max(0, int(params.get("context_lines", 0)))
    numbered = bool(params.get("return_line_numbers")) or context > 0
    source = re.escape(pattern) if params.get("literal") else pattern
    try:
        regex = re.compile(source, re.IGNORECASE if params.get("ignore_case") else 0)
    except re.error as e:
        raise ToolError(f"invalid regex: {e}") from None
    full = io.path(path)
    kind = await io.kind(full)
    if kind == "file":
        files = [(full, path)]
    elif kind == "dir":
        listing = await io.list_entries(full, 0, "file")
        files = [(f"{full.rstrip('/')}/{rel}", rel) for rel, _ in listing.entries if _selected(rel, include, exclude)]
    else:
        raise ToolError(f"path does not exist: {path}")
    out, total, capped = [], 0, False
    for fpath, shown in files:
        data = await io.read(fpath)
        if data is None:
            continue
        found, capped = await asyncio.to_thread(_grep_lines, data, regex, shown, context, numbered,
                                                GREP_MAX_RESULTS - total, out)
        total += found
        if capped:
            break
    text = "".join(out) + f"\n---\nTotal matches: {total}\n"
    if capped:
        text += f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
    return {"plain_text_response": text}


def _grep_lines(data: bytes, regex: re.Pattern, shown: str, context: int, numbered: bool,
                budget: int, out: list[str]) -> tuple[int, bool]:
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    found = 0
    for i, line in enumerate(lines):
        if found >= budget:
            return found, True
        if not regex.search(line):
            continue
        for j in range(max(0, i - context), min(len(lines) - 1, i + context) + 1):
            mark = ":" if j == i else "-"
            out.append(f"{shown}{mark}{f'{j + 1}{mark}' if numbered else ''}{lines[j]}\n")
        if context:
            out.append("--\n")
        found += 1
    return found, False
