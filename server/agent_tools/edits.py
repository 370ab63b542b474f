"""edit_file's rules, as llama-server 11434 applies them (tools/server/server-tools.cpp).

Every old_text is found in the original content (not in the result of the edits before it), must
occur once, and no two may overlap. When one is not found exactly, matching is fuzzy: per line,
trailing whitespace dropped and typographic quotes, dashes and spaces read as ASCII; the lines a
fuzzy edit does not touch are written back as they were.
"""
from __future__ import annotations

import re

from ggserve.server.agent_tools.errors import ToolError

_FUZZY = str.maketrans({
    **{c: "'" for c in "\u2018\u2019\u201a\u201b"}, **{c: '"' for c in "\u201c\u201d\u201e\u201f"},
    **{c: "-" for c in "\u2010\u2011\u2012\u2013\u2014\u2015\u2212"},
    **{c: " " for c in "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000"},
})


def fuzzy(text: str) -> str:
    """Each line without trailing spaces, tabs or CR, its typography read as ASCII."""
    return "\n".join(line.rstrip(" \t\r").translate(_FUZZY) for line in text.split("\n"))


def _count(content: str, needle: str) -> int:
    """Non-overlapping occurrences."""
    return content.count(needle)


def apply_edits(original: str, edits: list[tuple[str, str]], path: str) -> str:
    """The content with every (old_text, new_text) applied, or ToolError saying which rule broke."""
    any_fuzzy = False
    for i, (old, _) in enumerate(edits):
        if old in original:
            continue
        if fuzzy(old) not in fuzzy(original):
            raise ToolError(f"could not find edits[{i}].old_text in {path}, "
                            "it must match the file's current content exactly")
        any_fuzzy = True
    base = fuzzy(original) if any_fuzzy else original
    matched = []                     # (start, length, edit index, new_text)
    for i, (old, new) in enumerate(edits):
        found = _count(fuzzy(original), fuzzy(old))
        if found > 1:
            raise ToolError(f"found {found} occurrences of edits[{i}].old_text in {path}, it must be unique")
        needle = fuzzy(old) if any_fuzzy else old
        matched.append((base.find(needle), len(needle), i, new))
    matched.sort()
    for a, b in zip(matched, matched[1:]):
        if a[0] + a[1] > b[0]:
            raise ToolError(f"edits[{a[2]}] and edits[{b[2]}] overlap in {path}; "
                            "merge them into one edit or target disjoint regions")
    result = _keep_untouched_lines(original, base, matched) if any_fuzzy else _replace(base, matched)
    if result == original:
        raise ToolError("no changes made: the replacement(s) produced identical content")
    return result


def _lines(text: str) -> list[str]:
    """Lines split at '\\n' only, each with its '\\n'."""
    return re.findall(r"[^\n]*\n|[^\n]+$", text)


def _replace(content: str, matched: list[tuple]) -> str:
    for start, length, _, new in reversed(matched):
        content = content[:start] + new + content[start + length:]
    return content


def _keep_untouched_lines(original: str, base: str, matched: list[tuple]) -> str:
    """Replacements made on the fuzzy text, in the lines they touch; other lines as they were."""
    original_lines = _lines(original)
    spans, offset = [], 0
    for line in _lines(base):
        spans.append((offset, offset + len(line)))
        offset += len(line)
    groups: list[list] = []            # [first line, end line (exclusive), replacements]
    for rep in matched:
        start, length = rep[0], rep[1]
        first = next(i for i, (s, e) in enumerate(spans) if s <= start < e)
        last = first
        while last < len(spans) and spans[last][1] < start + length:
            last += 1
        if groups and first < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], last + 1)
            groups[-1][2].append(rep)
        else:
            groups.append([first, last + 1, [rep]])
    out, kept_until = [], 0
    for first, end, reps in groups:
        out += original_lines[kept_until:first]
        offset = spans[first][0]
        piece = base[offset:spans[end - 1][1]]
        out.append(_replace(piece, [(s - offset, n, i, new) for s, n, i, new in reps]))
        kept_until = end
    out += original_lines[kept_until:]
    return "".join(out)
