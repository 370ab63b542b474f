"""Scripts of tests/data loaded by their path under a name of their own: several folders
have a make_model.py, and a plain `import make_model` through sys.path would let the
first one imported stand in for the others in sys.modules."""
from __future__ import annotations

import importlib.util
import pathlib


def make_model(folder: pathlib.Path):
    """tests/data/<folder>/make_model.py as a module of its own."""
    spec = importlib.util.spec_from_file_location(f"{folder.name}_make_model", folder / "make_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
