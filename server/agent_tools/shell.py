"""exec_shell_command and get_info, as llama-server answers them."""
from __future__ import annotations

import os
from typing import Callable

from ggserve.server.agent_tools.errors import ToolError

MAX_OUTPUT = 16 * 1024
MAX_TIMEOUT = 60
INFO_TIMEOUT = 5


async def exec_shell_command(io, params: dict, push: Callable[[str], bool] | None = None) -> dict | None:
    """`sh -c command` in the working directory; stdout and stderr together, then the exit code.
    With push (a streamed call) the output goes there as it comes and the result is None."""
    command = params["command"]
    if not isinstance(command, str):
        raise ToolError('"command" must be a string')
    timeout = min(int(params.get("timeout", 10)), MAX_TIMEOUT)
    max_output = min(int(params.get("max_output_size", MAX_OUTPUT)), MAX_OUTPUT)
    res = await io.run(["sh", "-c", command], max_output, timeout, push)
    tail = f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
    if push is not None:
        push(tail)
        return None
    return {"plain_text_response": res.output + tail}


async def get_info(io, params: dict) -> dict:
    res = await io.run(["uname", "-a"], 4096, INFO_TIMEOUT)
    os_name = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
    cwd = io.cwd if io.cwd_given else None
    if cwd is None:
        pwd = await io.run(["pwd"], 4096, INFO_TIMEOUT)
        cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else os.getcwd()
    return {"os": os_name, "cwd": cwd}
