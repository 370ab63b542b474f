"""Architectures by `general.architecture`, and the errors a bad model file gives."""
from __future__ import annotations

_ARCHITECTURES: dict[str, type] = {}


class ModelError(ValueError):
    """A model file that cannot be run: unknown architecture, missing or misshapen tensor."""


def register(*names: str):
    def deco(cls):
        for n in names:
            _ARCHITECTURES[n] = cls
        return cls
    return deco


def _import_architectures() -> None:
    """Import every module of models/, so the architecture modules register
    themselves: a new architecture is a new file and nothing else."""
    import importlib
    import pkgutil

    import ggserve.models as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg:
            importlib.import_module(f"{package.__name__}.{info.name}")


def model_class(arch: str | None, path: str = "") -> type:
    if not _ARCHITECTURES:
        _import_architectures()

    if arch not in _ARCHITECTURES:
        where = f"{path}: " if path else ""
        raise ModelError(
            f"{where}unsupported architecture {arch!r} (supported: {', '.join(sorted(_ARCHITECTURES))})"
        )
    return _ARCHITECTURES[arch]
