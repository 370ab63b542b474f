"""Small modules with one job each: none over 400 lines, and in the API layer
(server/api, server/cli, server/app.py) no function over 60 lines."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400
MAX_API_FUNCTION_LINES = 60


def _modules(*folders: str) -> list[pathlib.Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _api_modules() -> list[pathlib.Path]:
    return _modules("server/api", "server/cli") + [ROOT / "server" / "app.py"]


def _long_functions(path: pathlib.Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{node.name} ({node.end_lineno - node.lineno + 1} lines)" for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


@pytest.mark.parametrize("path", _modules("server", "models"), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_is_at_most_400_lines(path):
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES


@pytest.mark.parametrize("path", _api_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_api_functions_are_at_most_60_lines(path):
    assert _long_functions(path, MAX_API_FUNCTION_LINES) == []


def test_a_long_function_is_found(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n" + "    x = 1\n" * 61, encoding="utf-8")
    assert _long_functions(probe, MAX_API_FUNCTION_LINES) == ["f (62 lines)"]
