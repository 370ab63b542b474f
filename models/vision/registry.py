"""Projector families by `clip.projector_type`: one module of models/vision/ each.

A family module subclasses `Family` and registers it; a new family is a new file
and nothing else (every module of models/vision/ is imported on first lookup):

    @register("pixtral")
    class Pixtral(Family):
        ...

`when` picks a variant of a projector type from the header (LLaVA-1.6 is the
`mlp` type with `clip.vision.image_grid_pinpoints`): registrations with a `when`
are tried first, in registration order. The projector types gemma3, idefics3 and
mlp (LLaVA-1.5) without a registered family run the built-in paths of encoder.py,
preprocess.py and arrange.py.

What a family owns (VisionModel and arrange() call it):
  __init__(cfg, meta, path)  its extra hyperparameters from the header (ModelError naming the file)
  load(w)                    its tensors, tower included (`w`: models.weights.Weights)
  plan(width, height)        -> preprocess.Plan, without touching pixels
  preprocess(rgb)            uint8 [H, W, 3] -> preprocess.Tiles (float32 CHW tiles, n_tokens per tile)
  build(g, width, height)    one tile's graph -> (inp_raw, output f32 [n_embd_out, n_tokens])
  max_sizes()                tile sizes (width, height) whose graphs bound every tile's compute memory
  layout(tiles, text, image) the prompt around one image: text(str) tokenizes text, image(i, bidirectional=False)
                             places tile i's rows; check_vocab(tokenizer) refuses a text model without its tokens
"""
from __future__ import annotations

from ggserve.models.registry import ModelError

# projector type -> [(when, Family subclass)]
_FAMILIES: dict[str, list] = {}
_imported = False

BUILTIN = ("gemma3", "idefics3", "mlp")       # the paths of encoder.py / preprocess.py / arrange.py


def register(*projector_types: str, when=None):
    """Register a Family subclass for these `clip.projector_type` values.

    when: optional predicate on the mmproj metadata dict (a variant of the type)."""
    def deco(cls):
        for t in projector_types:
            entries = _FAMILIES.setdefault(t, [])
            entries.insert(sum(1 for w, _ in entries if w is not None) if when is not None else len(entries),
                           (when, cls))
        cls.projector_types = tuple(projector_types)
        return cls
    return deco


def _import_families() -> None:
    global _imported
    if _imported:
        return
    _imported = True
    import importlib
    import pkgutil

    import ggserve.models.vision as package

    for info in pkgutil.iter_modules(package.__path__):
        if not info.ispkg and info.name not in ("registry", "__init__"):
            importlib.import_module(f"{package.__name__}.{info.name}")


def supported() -> tuple[str, ...]:
    _import_families()
    return tuple(sorted(set(BUILTIN) | set(_FAMILIES)))


def family_class(projector: str, meta: dict):
    """The Family subclass for this projector type and header, or None for a built-in path."""
    _import_families()
    for when, cls in _FAMILIES.get(projector, ()):
        if when is None or when(meta):
            return cls
    if projector in BUILTIN:
        return None
    raise ModelError(f"unsupported projector type {projector!r} (supported: {', '.join(supported())})")


class Family:
    """Base of a projector family (see the module docstring). `name` appears in logs."""

    name = "?"
    projector_types: tuple = ()
    n_embd_out = 0

    def __init__(self, cfg, meta: dict, path: str):
        self.cfg, self.path = cfg, path

    def check_vocab(self, tokenizer) -> None:
        pass

    def max_sizes(self) -> list[tuple[int, int]]:
        side = self.cfg.image_size
        return [(side, side)]
