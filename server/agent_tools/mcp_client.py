"""One running MCP server over stdio: its process and the official SDK's `ClientSession` on it.

The transport is ours (the SDK's `stdio_client` waits 2 s for a server to leave after its stdin
closes, and the server must stop faster than that): one JSON-RPC message per line each way,
lines that are not JSON-RPC skipped (the SDK parses and correlates the rest: replies by id,
notifications apart). The process gets its own process group, killed whole on close, so a
grandchild holding the pipes cannot keep anything waiting.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal

import anyio
import mcp_types as types
from anyio.streams.text import TextReceiveStream
from mcp.client.session import ClientSession
from mcp.shared.message import SessionMessage

from ggserve.server.agent_tools.mcp_config import McpServerConfig

log = logging.getLogger("ggserve.server")
EXIT_GRACE_SECONDS = 0.3          # after stdin closes, before the process group is killed
STDERR_TAIL = 2048


class McpConnection:
    def __init__(self, cfg: McpServerConfig):
        self.cfg = cfg
        self.session: ClientSession | None = None
        self.stderr_tail = ""
        self._proc = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def open(self, timeout: float) -> None:
        """Spawn and initialize; raises (OSError, TimeoutError, an SDK error) when it cannot."""
        ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run(ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), timeout)
        except BaseException:
            await self.close()
            raise

    def alive(self) -> bool:
        return (self._task is not None and not self._task.done() and not self._closing.is_set()
                and self._proc is not None and self._proc.returncode is None)

    async def close(self) -> None:
        self._closing.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, ready: asyncio.Future) -> None:
        try:
            self._proc = await anyio.open_process(
                [self.cfg.command, *self.cfg.args], env={**os.environ, **self.cfg.env}, cwd=self.cfg.cwd,
                start_new_session=True)
            to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](16)
            to_server, from_session = anyio.create_memory_object_stream[SessionMessage](16)
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._read_stdout, to_session)
                tg.start_soon(self._write_stdin, from_session)
                tg.start_soon(self._read_stderr)
                try:
                    async with ClientSession(from_server, to_server) as session:
                        await session.initialize()
                        self.session = session
                        ready.set_result(None)
                        await self._closing.wait()
                finally:
                    await self._stop()
                    tg.cancel_scope.cancel()
        except Exception as e:                      # the reason goes to open(), or to the log
            if not ready.done():
                ready.set_exception(e)
            else:
                log.warning("MCP '%s' ended: %s", self.cfg.name, e)
        finally:
            self._closing.set()
            if not ready.done():
                ready.set_exception(ConnectionError(f"MCP server '{self.cfg.name}' ended"))

    async def _read_stdout(self, sink) -> None:
        buffer = ""
        async with sink:
            try:
                async for chunk in TextReceiveStream(self._proc.stdout, errors="replace"):
                    *lines, buffer = (buffer + chunk).split("\n")
                    for line in lines:
                        try:
                            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        except ValueError:
                            continue            # not JSON-RPC: skipped, as llama-server skips it
                        await sink.send(SessionMessage(message))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass
            finally:
                self._closing.set()             # EOF: the server is gone (said before the session hears it)

    async def _write_stdin(self, source) -> None:
        async with source:
            try:
                async for message in source:
                    line = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await self._proc.stdin.send(line.encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                self._closing.set()

    async def _read_stderr(self) -> None:
        try:
            async for chunk in TextReceiveStream(self._proc.stderr, errors="replace"):
                log.debug("MCP '%s' stderr: %s", self.cfg.name, chunk.rstrip())
                self.stderr_tail = (self.stderr_tail + chunk)[-STDERR_TAIL:]
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass

    async def _stop(self) -> None:
        with anyio.CancelScope(shield=True):
            proc = self._proc
            try:
                await proc.stdin.aclose()
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass
            with anyio.move_on_after(EXIT_GRACE_SECONDS):
                await proc.wait()
            try:
                os.killpg(proc.pid, signal.SIGKILL)       # the server and whatever it left behind
            except (ProcessLookupError, PermissionError):
                pass
            with anyio.move_on_after(2):
                while proc.returncode is None:
                    await anyio.sleep(0.01)


def result_to_response(result: types.CallToolResult) -> dict:
    """An MCP tool's result as /tools answers it: its text parts, or its error."""
    text = "\n".join(part.text for part in result.content if isinstance(part, types.TextContent))
    if result.is_error:
        return {"error": text or "MCP tool returned an error"}
    return {"plain_text_response": text}

