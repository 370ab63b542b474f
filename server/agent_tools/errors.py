"""What goes wrong in a tool call, by whose fault."""
from __future__ import annotations


class ToolError(Exception):
    """The tool ran and failed: reported as the tool's result, `{"error": message}`."""


class ToolRequestError(Exception):
    """The request cannot run any tool (status: llama-server's answer for it)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
