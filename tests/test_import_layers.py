"""Imports go one way (docs/architecture.md): api -> chat, service; service -> chat,
engine; engine -> models -> native. Every import in the source counts, including
those inside functions; a module's layer is its folder."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# source folder -> the import package it is installed as (setup.py's package_dir)
PARTS = {"native": "ggserve.native", "models": "ggserve.models", "server": "ggserve.server"}

# layer -> the layers it must not import
FORBIDDEN = {
    "ggserve.models": ("ggserve.server",),
    "ggserve.server.engine": ("ggserve.server.api", "ggserve.server.chat", "ggserve.server.service",
                              "ggserve.server.cli", "ggserve.server.app"),
    "ggserve.server.chat": ("ggserve.server.api", "ggserve.server.service", "ggserve.server.cli",
                            "ggserve.server.app", "ggserve.server.engine"),
    "ggserve.server.service": ("ggserve.server.api", "ggserve.server.cli", "ggserve.server.app"),
    "ggserve.server.api": ("ggserve.server.cli", "ggserve.server.app"),
    # the chat page's tools: files, commands, MCP servers; nothing of the model's side
    "ggserve.server.agent_tools": ("ggserve.server.api", "ggserve.server.chat", "ggserve.server.service",
                                   "ggserve.server.engine", "ggserve.server.cli", "ggserve.server.app"),
}
# The API reaches the engine through the service; what it may import from the engine
# are values and pure functions, never the engine itself.
API_FROM_ENGINE = {
    "ggserve.server.engine.sampling.sampler",    # SamplingParams: a request's sampling, checked when made
    "ggserve.server.engine.pooling",             # normalize, rank_score: an embedding's math
    "ggserve.server.engine.memory.slot_files",   # path_in: a slot file's safe name
}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PARTS[parts[0]], *parts[1:]])


def _imports(path: pathlib.Path, module: str | None = None) -> set[str]:
    """Every module the file at path (the module named `module`) imports, relative imports resolved."""
    module = module or _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)   # `from pkg import module`
    return found


def _sources() -> list[pathlib.Path]:
    return sorted(p for part in ("models", "server") for p in (ROOT / part).rglob("*.py"))


def _layer_of(module: str) -> str | None:
    return next((layer for layer in FORBIDDEN if module == layer or module.startswith(layer + ".")), None)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_go_one_way(path):
    layer = _layer_of(_module_name(path))
    if layer is None:
        return
    wrong = sorted(name for name in _imports(path) for banned in FORBIDDEN[layer] if _under(name, banned))
    assert wrong == [], f"{path.relative_to(ROOT)} ({layer}) imports {wrong}"


@pytest.mark.parametrize("path", sorted((ROOT / "server" / "api").rglob("*.py")), ids=lambda p: p.name)
def test_the_api_reaches_the_engine_only_through_the_service(path):
    engine = {name for name in _imports(path) if _under(name, "ggserve.server.engine")}
    allowed = {name for name in engine if any(_under(name, m) for m in API_FROM_ENGINE)
               or name.rpartition(".")[0] in API_FROM_ENGINE or name in {"ggserve.server.engine",
                                                                         "ggserve.server.engine.memory"}}
    assert engine - allowed == set(), f"{path.relative_to(ROOT)} imports the engine's {sorted(engine - allowed)}"


def test_the_resolver_sees_a_relative_up_call(tmp_path):
    """The checks above can fail: a relative import from chat/ into api/ is found."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..api import errors\n", encoding="utf-8")
    found = _imports(probe, "ggserve.server.chat.probe")
    assert "ggserve.server.api.errors" in found
    assert any(_under(n, b) for n in found for b in FORBIDDEN[_layer_of("ggserve.server.chat.probe")])


def test_server_keeps_few_modules_at_its_top():
    top = sorted(p.name for p in (ROOT / "server").glob("*.py"))
    assert len(top) <= 15, top
