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


def model_class(arch: str | None, path: str = "") -> type:
    # import the architecture modules so they register themselves
    from ggserve.models import gemma3, llama  # noqa: F401

    if arch not in _ARCHITECTURES:
        where = f"{path}: " if path else ""
        raise ModelError(
            f"{where}unsupported architecture {arch!r} (supported: {', '.join(sorted(_ARCHITECTURES))})"
        )
    return _ARCHITECTURES[arch]
