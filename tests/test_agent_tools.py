"""The chat page's tools (server/agent_tools/), called through ToolBox as /tools calls them.

Expectations are llama-server 11434's answers (its tools/server/server-tools.cpp and the suite's
test_tools_builtin.py), and each safety rule has its own test: paths that leave the working
directory or --tools-root, runtimes whose id could read as an option.
"""
from __future__ import annotations

import asyncio
import functools
import os
import sys

import pytest

from ggserve.server.agent_tools import builtin, runtimes
from ggserve.server.agent_tools.errors import ToolRequestError
from ggserve.server.agent_tools.mcp_config import McpServerConfig, load
from ggserve.server.agent_tools.mcp_servers import McpServers
from ggserve.server.agent_tools.search import path_glob_match
from ggserve.server.agent_tools.toolbox import CallPlace, ToolBox

NOTES = os.path.join(os.path.dirname(__file__), "data", "mcp", "notes_server.py")


def call(name, params, cwd=None, root=None, runtime=None, box=None):
    box = box or ToolBox(builtin.enabled(["all"]), root=root)
    return asyncio.run(box.invoke(name, params, CallPlace(cwd=str(cwd) if cwd else None, runtime=runtime)))


# --- files ------------------------------------------------------------------------------------

def test_write_then_edit_applies_every_edit_to_the_original(tmp_path):
    assert call("write_file", {"path": "t.log", "content": "line1\nline2\nline3\n"}, tmp_path)["result"] \
        == "file written successfully"
    res = call("edit_file", {"path": "t.log", "edits": [{"old_text": "line2", "new_text": "line2-edited"},
                                                        {"old_text": "line3\n", "new_text": "line3\nline4\n"}]},
               tmp_path)
    assert res == {"result": "file edited successfully", "path": "t.log", "edits_applied": 2}
    assert (tmp_path / "t.log").read_text() == "line1\nline2-edited\nline3\nline4\n"


def test_edit_refuses_old_text_that_is_not_unique(tmp_path):
    (tmp_path / "t.log").write_text("dup\ndup\n")
    res = call("edit_file", {"path": "t.log", "edits": [{"old_text": "dup", "new_text": "x"}]}, tmp_path)
    assert res == {"error": "found 2 occurrences of edits[0].old_text in t.log, it must be unique"}
    assert (tmp_path / "t.log").read_text() == "dup\ndup\n"


def test_edit_refuses_overlapping_edits(tmp_path):
    (tmp_path / "t.log").write_text("line1\nline2\n")
    res = call("edit_file", {"path": "t.log", "edits": [{"old_text": "line1\nline2", "new_text": "a"},
                                                        {"old_text": "line2", "new_text": "b"}]}, tmp_path)
    assert "overlap" in res["error"]


def test_edit_matches_typographic_quotes_and_keeps_other_lines_as_they_were(tmp_path):
    (tmp_path / "t.py").write_text("x = \u201chi\u201d   \ny = \u2014\n")
    res = call("edit_file", {"path": "t.py", "edits": [{"old_text": 'x = "hi"', "new_text": "x = 1"}]}, tmp_path)
    assert res["edits_applied"] == 1
    assert (tmp_path / "t.py").read_text() == "x = 1\ny = \u2014\n"


def test_read_file_line_range_with_locations(tmp_path):
    (tmp_path / "f.txt").write_text("a\nb\nc\n")
    res = call("read_file", {"path": "f.txt", "start_line": 2, "end_line": 3, "append_loc": True}, tmp_path)
    assert res == {"plain_text_response": "2\u2192b\n3\u2192c\n"}


def test_a_missing_parameter_is_a_tool_error_not_a_server_error(tmp_path):
    assert call("read_file", {}, tmp_path) == {"error": "missing parameter: path"}


# --- search -----------------------------------------------------------------------------------

def test_globs_as_llama_cpp_matches_them():
    assert path_glob_match("*.py", "a/b/test_x.py")           # no '/': the basename at any depth
    assert path_glob_match("src/*.cpp", "x/src/main.cpp")     # anchored with **/
    assert not path_glob_match("src/*.cpp", "src/a/main.cpp")  # * stops at '/'
    assert path_glob_match("src/**", "x/src/a/main.cpp")     # ** crosses "/"
    assert path_glob_match("[!a]*.txt", "b.txt") and not path_glob_match("[!a]*.txt", "a.txt")


def test_glob_search_lists_junk_directories_but_never_walks_them(tmp_path):
    (tmp_path / "build" / "nested").mkdir(parents=True)
    (tmp_path / "build" / "artifact.txt").write_text("x")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.cpp").write_text("x")
    res = call("file_glob_search", {"path": str(tmp_path), "type": "all"})
    assert sorted(e["path"] for e in res["entries"]) == ["build", "src", "src/main.cpp"]


def test_glob_search_depth_and_limit(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for rel in ("top.txt", "a/mid.txt", "a/b/deep.txt"):
        (tmp_path / rel).write_text(rel)
    assert [e["path"] for e in call("file_glob_search", {"path": str(tmp_path), "max_depth": 1})["entries"]] \
        == ["top.txt"]
    res = call("file_glob_search", {"path": str(tmp_path), "limit": 1})
    assert len(res["entries"]) == 1 and "Total matches: 3" in res["plain_text_response"]
    assert call("file_glob_search", {"path": str(tmp_path), "type": "bogus"}) \
        == {"error": 'invalid type: bogus (expected "file", "dir" or "all")'}


def test_grep_with_context_and_line_numbers(tmp_path):
    (tmp_path / "f.txt").write_text("one\ntwo\nthree\n")
    res = call("grep_search", {"path": "f.txt", "pattern": "tw.", "context_lines": 1}, tmp_path)
    assert res["plain_text_response"] == "f.txt-1-one\nf.txt:2:two\nf.txt-3-three\n--\n\n---\nTotal matches: 1\n"


def test_shell_runs_in_the_working_directory(tmp_path):
    res = call("exec_shell_command", {"command": "pwd; exit 3"}, tmp_path)
    assert res == {"plain_text_response": f"{tmp_path}\n\n[exit code: 3]"}


def test_a_command_that_closes_its_output_early_still_gets_its_exit_code(tmp_path):
    res = call("exec_shell_command", {"command": "echo out; exec >&- 2>&-; sleep 0.3; exit 4"}, tmp_path)
    assert res == {"plain_text_response": "out\n\n[exit code: 4]"}


def test_a_command_past_its_timeout_is_killed_with_its_children(tmp_path):
    res = call("exec_shell_command", {"command": "(sleep 30; touch late) & echo started; sleep 30", "timeout": 1},
               tmp_path)
    assert res == {"plain_text_response": "started\n\n[exit code: -9] [exit due to timed out]"}
    assert not (tmp_path / "late").exists()


# --- safety: paths ----------------------------------------------------------------------------

def test_a_relative_path_may_not_climb_out_of_the_working_directory(tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "work").mkdir()
    assert call("read_file", {"path": "../secret.txt"}, tmp_path / "work") \
        == {"error": "path escapes the working directory: ../secret.txt"}
    assert call("write_file", {"path": "a/../../x.txt", "content": "x"}, tmp_path / "work")["error"] \
        == "path escapes the working directory: a/../../x.txt"
    assert not (tmp_path / "x.txt").exists()


def test_a_symlink_out_of_the_working_directory_is_refused(tmp_path):
    (tmp_path / "secret.txt").write_text("secret")
    (tmp_path / "work").mkdir()
    os.symlink(tmp_path / "secret.txt", tmp_path / "work" / "link.txt")
    assert call("read_file", {"path": "link.txt"}, tmp_path / "work") \
        == {"error": "path escapes the working directory: link.txt"}


def test_tools_root_confines_absolute_paths_and_the_working_directory(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "outside.txt").write_text("no")
    root = str(tmp_path / "root")
    assert call("read_file", {"path": str(tmp_path / "outside.txt")}, tmp_path / "root", root=root) \
        == {"error": f"path is outside --tools-root: {tmp_path / 'outside.txt'}"}
    assert call("exec_shell_command", {"command": "true"}, tmp_path, root=root) \
        == {"error": f"working directory is outside --tools-root: {tmp_path}"}
    assert call("write_file", {"path": "in.txt", "content": "ok"}, tmp_path / "root", root=root)["bytes"] == 2


def test_absolute_paths_outside_the_working_directory_work_without_a_root(tmp_path):
    """As llama-server (its suite reads an absolute path beside the x-tool-cwd)."""
    (tmp_path / "other.txt").write_text("absolute-content")
    (tmp_path / "work").mkdir()
    assert call("read_file", {"path": str(tmp_path / "other.txt")}, tmp_path / "work") \
        == {"plain_text_response": "absolute-content\n"}


# --- safety: runtimes -------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("docker-container:--privileged", "invalid container id: --privileged"),
    ("podman-container:-v/:/host", "invalid container id: -v/:/host"),
    ("ssh:-oProxyCommand=touch /tmp/pwned", "invalid ssh target: -oProxyCommand=touch /tmp/pwned"),
    ("fake:does-not-exist", "unknown tool runtime: fake:does-not-exist"),
])
def test_a_runtime_that_could_inject_an_option_is_refused_before_anything_runs(tmp_path, spec, message):
    with pytest.raises(ToolRequestError) as e:
        call("exec_shell_command", {"command": f"touch {tmp_path}/ran"}, runtime=spec)
    assert (e.value.status, str(e.value)) == (500, message)
    assert not (tmp_path / "ran").exists()


def test_a_valid_container_id_goes_after_exec_and_the_command_as_arguments():
    io = runtimes.IsolateIO("docker-container:abc123", None, None)
    assert io.argv(["sh", "-c", "echo hi"], False) == ["docker", "exec", "abc123", "sh", "-c", "echo hi"]
    ssh = runtimes.IsolateIO("ssh:me@host", None, None)
    assert ssh.argv(["cat", "a b"], False)[-2:] == ["me@host", "cat 'a b'"]


# --- MCP servers ------------------------------------------------------------------------------

def notes(name="notes", timeout_ms=30000, command=sys.executable, env=None):
    return McpServerConfig(name, command, (NOTES,), env or {}, None, timeout_ms)


def test_mcp_tools_listed_as_server_tool_and_called():
    async def run():
        box = ToolBox([], McpServers([notes()]))
        await box.start()
        try:
            names = [t["tool"] for t in box.listing()]
            answer = await box.invoke("notes_echo", {"message": "hello"}, CallPlace())
            failed = await box.invoke("notes_fail", {}, CallPlace())
            chatty = await box.invoke("notes_chatty", {}, CallPlace())    # a notification and a stray line first
            return names, answer, failed, chatty
        finally:
            await box.close()
    names, answer, failed, chatty = asyncio.run(run())
    assert names == ["notes_echo", "notes_add", "notes_fail", "notes_sleep", "notes_crash", "notes_pid",
                     "notes_chatty"]
    assert answer == {"plain_text_response": "echo: hello"}
    assert failed == {"error": "Error executing tool fail"}
    assert chatty == {"plain_text_response": "answered"}


def test_mcp_server_respawned_after_a_crash_and_a_slow_call_times_out(tmp_path):
    log = tmp_path / "spawns"

    async def run():
        servers = McpServers([notes(timeout_ms=1500, env={"NOTES_SPAWN_LOG": str(log)})])
        await servers.warm_up()
        try:
            first = await servers.call("notes", "pid", {})
            crashed = await servers.call("notes", "crash", {})
            second = await servers.call("notes", "pid", {})
            slow = await servers.call("notes", "sleep", {"seconds": 5})
            return first, crashed, second, slow
        finally:
            await servers.close()
    first, crashed, second, slow = asyncio.run(run())
    assert "error" in crashed and "error" in slow
    assert first["plain_text_response"] != second["plain_text_response"]
    assert len(log.read_text().split()) == 3        # warm-up, first call, after the crash


def test_an_mcp_server_that_cannot_start_adds_no_tools_and_others_still_do():
    async def run():
        box = ToolBox([], McpServers([notes("good"), notes("bad", command="no_such_executable_38")]))
        await box.start()
        try:
            names = [t["tool"] for t in box.listing()]
            with pytest.raises(ToolRequestError) as e:
                await box.invoke("bad_echo", {}, CallPlace())
            return names, e.value.status, await box.invoke("good_echo", {"message": "hi"}, CallPlace())
        finally:
            await box.close()
    names, status, answer = asyncio.run(run())
    assert names == ["good_echo", "good_add", "good_fail", "good_sleep", "good_crash", "good_pid", "good_chatty"]
    assert status == 404 and answer == {"plain_text_response": "echo: hi"}


def test_mcp_config_errors_and_skipped_entries(tmp_path):
    with pytest.raises(ValueError, match="failed to parse MCP config JSON"):
        load(None, "not valid json")
    with pytest.raises(ValueError, match="failed to open MCP config file"):
        load(str(tmp_path / "missing.json"), None)
    parsed = load(None, '{"mcpServers": {"a": {"command": "x", "timeout_ms": 500}, "b": {"args": []}}}')
    assert [(c.name, c.timeout_ms) for c in parsed] == [("a", 500)]


# --- runtimes: every operation as a command on the far side ----------------------------------

@pytest.fixture
def local_docker(tmp_path, monkeypatch):
    """A `docker` that runs `docker exec [-i] ID CMD...` as CMD here: IsolateIO's commands (sh, cat, wc,
    find, timeout) then run for real, as they would inside a container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # `docker run --rm -i --cidfile F IMAGE sh`: writes an id, then a shell reading stdin stands for the container
    (bin_dir / "docker").write_text('#!/bin/sh\nif [ "$1" = run ]; then echo cid$$ > "$5"; exec sh; fi\n'
                                    '[ "$1" = exec ] || exit 99\nshift\n[ "$1" = -i ] && shift\n'
                                    'shift\nexec "$@"\n')
    (bin_dir / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    work = tmp_path / "work"
    work.mkdir()
    return work


def test_tools_through_a_container_runtime(local_docker):
    run = functools.partial(call, cwd=local_docker, runtime="docker-container:abc123")
    assert run("write_file", {"path": "sub/a.txt", "content": "hello\nworld\n"})["bytes"] == 12
    assert (local_docker / "sub" / "a.txt").read_text() == "hello\nworld\n"
    assert run("read_file", {"path": "sub/a.txt"}) == {"plain_text_response": "hello\nworld\n"}
    edited = run("edit_file", {"path": "sub/a.txt", "edits": [{"old_text": "world", "new_text": "there"}]})
    assert edited == {"result": "file edited successfully", "path": "sub/a.txt", "edits_applied": 1}
    assert edited[
        "edits_applied"] == 1
    assert run("grep_search", {"path": ".", "pattern": "the"})["plain_text_response"].startswith("sub/a.txt:there\n")
    listed = run("file_glob_search", {"path": ".", "type": "all"})
    assert sorted(e["path"] for e in listed["entries"]) == ["sub", "sub/a.txt"]
    assert run("exec_shell_command", {"command": "cat sub/a.txt"}) == {
        "plain_text_response": "hello\nthere\n\n[exit code: 0]"}
    assert run("read_file", {"path": "../x"}) == {"error": "path escapes the working directory: ../x"}


def test_a_runtime_container_is_started_kept_and_stopped_with_the_server(local_docker):
    async def run():
        box = ToolBox(builtin.enabled(["exec_shell_command"]), runtime="docker:busybox")
        await box.start()
        first = box.owned.proc
        answer = await box.invoke("exec_shell_command", {"command": "echo inside"}, CallPlace(cwd=str(local_docker)))
        spec = await box.owned.spec()
        first.kill()                                  # the container dies: the next call starts another
        await first.wait()
        again = await box.invoke("exec_shell_command", {"command": "echo again"}, CallPlace(cwd=str(local_docker)))
        second = box.owned.proc
        await box.close()
        return answer, spec, again, first is not second, second.returncode
    answer, spec, again, respawned, code = asyncio.run(run())
    assert answer == {"plain_text_response": "inside\n\n[exit code: 0]"}
    assert spec.startswith("docker-container:cid")
    assert again == {"plain_text_response": "again\n\n[exit code: 0]"} and respawned
    assert code == 0                                  # stdin closed: the container's shell ended
