"""The built-in tools: what each is called, what the model is told about it, what runs it.

Definitions are llama-server 11434's (tools/server/server-tools.cpp), so the chat page and the
model see the same tools on either server. llama.cpp keeps this set to plain file and shell
access on purpose; anything higher-level belongs in an MCP server.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Awaitable, Callable

from ggserve.server.agent_tools import files, search, shell


@dataclass(frozen=True)
class BuiltinTool:
    name: str
    display_name: str
    description: str
    properties: dict
    required: tuple[str, ...]
    run: Callable[..., Awaitable[dict | None]]
    write: bool = False              # changes something: the page asks before it runs
    stream: bool = False

    def listing(self) -> dict:
        """The tool as GET /tools lists it."""
        parameters = {"type": "object", "properties": self.properties}
        if self.required:
            parameters["required"] = list(self.required)
        return {"display_name": self.display_name, "tool": self.name, "type": "server",
                "permissions": {"write": self.write}, "uses_cwd": True,
                "definition": {"type": "function", "function": {
                    "name": self.name, "description": self.description, "parameters": parameters}}}


def _p(type_: str, description: str) -> dict:
    return {"type": type_, "description": description}


_EDIT_ITEM = {"type": "object", "properties": {
    "old_text": _p("string", "Exact text to find; must be unique in the file and must not overlap with other edits"),
    "new_text": _p("string", "Text to replace old_text with")}, "required": ["old_text", "new_text"]}

BUILTIN_TOOLS = (
    BuiltinTool("read_file", "Read file",
                "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
                "each line is prefixed with its line number (e.g. \"1\u2192...\").",
                {"path": _p("string", "Path to the file"),
                 "start_line": _p("integer", "First line to read, 1-based (default: 1)"),
                 "end_line": _p("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                 "append_loc": _p("boolean", "Prefix each line with its line number")},
                ("path",), files.read_file),
    BuiltinTool("file_glob_search", "File search",
                "Recursively search for files matching a glob pattern under a directory. Automatically skips files "
                "ignored by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
                "node_modules, build, dist, etc.) otherwise. A pattern with no '/' (e.g. \"*.cpp\") matches the "
                "file's basename at any depth. A pattern containing '/' matches the full relative path; unless "
                "already anchored with \"**/\" or a leading '/', it is automatically prefixed with \"**/\". Use "
                "type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the "
                "output. Note: directory listings do not apply .gitignore filtering.",
                {"path": _p("string", "Base directory to search in"),
                 "include": _p("string", "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). "
                                         "Default: **"),
                 "exclude": _p("string", "Glob pattern for files to exclude"),
                 "type": _p("string", "Entry type to return: \"file\" (default), \"dir\" or \"all\""),
                 "max_depth": _p("integer", "Maximum depth to descend into subdirectories (default: 0 = unlimited; "
                                            "1 = direct children only)"),
                 "limit": _p("integer", "Maximum number of results to return, capped at 100 (default 100)")},
                ("path",), search.file_glob_search),
    BuiltinTool("grep_search", "Grep search",
                "Search for a pattern in files under a path. Returns matching lines with file paths (and, unless "
                "searching a single file, paths relative to the given directory). Automatically skips files ignored "
                "by .gitignore (when the directory is inside a git repo) and common junk directories (.git, "
                "node_modules, build, dist, etc.) otherwise. include/exclude: a pattern with no '/' matches the "
                "basename at any depth; a pattern containing '/' matches the full relative path (auto-anchored with "
                "\"**/\" unless already anchored).",
                {"path": _p("string", "File or directory to search in"),
                 "pattern": _p("string", "Pattern to search for (regular expression unless literal is true)"),
                 "include": _p("string", "Glob pattern to filter files (default: **)"),
                 "exclude": _p("string", "Glob pattern to exclude files"),
                 "return_line_numbers": _p("boolean", "If true, include line numbers in results"),
                 "literal": _p("boolean", "Treat pattern as a literal string instead of a regular expression "
                                          "(default: false)"),
                 "ignore_case": _p("boolean", "Case-insensitive search (default: false)"),
                 "context_lines": _p("integer", "Number of lines of context to show before and after each match "
                                                "(default: 0)")},
                ("path", "pattern"), search.grep_search),
    BuiltinTool("exec_shell_command", "Execute shell command",
                "Execute a shell command and return its output (stdout and stderr combined).",
                {"command": _p("string", "Shell command to execute"),
                 "timeout": _p("integer", f"Timeout in seconds (default 10, max {shell.MAX_TIMEOUT})"),
                 "max_output_size": _p("integer", f"Maximum output size in bytes (default {shell.MAX_OUTPUT})")},
                ("command",), shell.exec_shell_command, write=True, stream=True),
    BuiltinTool("write_file", "Write file",
                "Write content to a file, creating it (including parent directories) if it does not exist. May use "
                "with edit_file for more complex edits.",
                {"path": _p("string", "Path of the file to write"), "content": _p("string", "Content to write")},
                ("path", "content"), files.write_file, write=True),
    BuiltinTool("edit_file", "Edit file",
                "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and is "
                "matched against the original content, not incrementally. Merge nearby changes into one edit "
                "instead of overlapping edits. Use write_file to replace the whole file.",
                {"path": _p("string", "Path to the file to edit"),
                 "edits": {"type": "array", "description": "One or more exact text replacements to apply",
                           "items": _EDIT_ITEM}},
                ("path", "edits"), files.edit_file, write=True),
    BuiltinTool("get_info", "Get Runtime Info",
                "Returns runtime info: the OS name/version and the current working directory",
                {}, (), shell.get_info),
)
NAMES = tuple(t.name for t in BUILTIN_TOOLS)


def enabled(names: list[str]) -> list[BuiltinTool]:
    """--tools: "all" or names; an unknown name is a ValueError that lists the known ones."""
    unknown = [n for n in names if n != "all" and n not in NAMES]
    if unknown:
        raise ValueError(f'unknown tool "{unknown[0]}". available tools: {", ".join(NAMES)}')
    return [t for t in BUILTIN_TOOLS if "all" in names or t.name in names]
