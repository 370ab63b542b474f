"""llama-server's LoRA and control-vector flags (server/engine/adapters.py), read as it reads them:
comma-separated files, FNAME:SCALE pairs, a flag given again adds more."""
from __future__ import annotations

import argparse

from ggserve.server.engine.adapters import AdapterConfig


class _Files(argparse.Action):
    """FNAME[,FNAME...] (scale 1) or, with `scaled`, FNAME:SCALE[,...]: appended to the list."""

    def __init__(self, option_strings, dest, scaled: bool = False, **kw):
        self.scaled = scaled
        super().__init__(option_strings, dest, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        out = list(getattr(namespace, self.dest) or [])
        for item in values.split(","):
            if not self.scaled:
                out.append((item, 1.0))
                continue
            parts = item.split(":")
            try:
                if len(parts) != 2:
                    raise ValueError
                out.append((parts[0], float(parts[1])))
            except ValueError:
                parser.error(f"{option_string}: expected FNAME:SCALE, got {item!r}")
        setattr(namespace, self.dest, out)


def add_adapter_flags(p) -> None:
    """LoRA adapters (several may be served at once; each request picks its own with `lora`)
    and control vectors (for every request)."""
    p.add_argument("--lora", action=_Files, dest="lora", default=[], metavar="FNAME",
                   help="LoRA adapter (llama.cpp's GGUF; comma-separated for several), scale 1; ids in the "
                        "order given; GET/POST /lora-adapters, a request's `lora` field [{id, scale}]")
    p.add_argument("--lora-scaled", action=_Files, scaled=True, dest="lora", metavar="FNAME:SCALE,...",
                   help="LoRA adapter with its default scale")
    p.add_argument("--lora-init-without-apply", action="store_true",
                   help="accepted as llama-server 11434 takes it: its server applies every adapter at its "
                        "scale anyway (POST /lora-adapters sets the scales)")
    p.add_argument("--control-vector", action=_Files, dest="control_vectors", default=[], metavar="FNAME",
                   help="control vector added to each layer's output (comma-separated for several, summed)")
    p.add_argument("--control-vector-scaled", action=_Files, scaled=True, dest="control_vectors",
                   metavar="FNAME:SCALE,...", help="control vector times SCALE")
    p.add_argument("--control-vector-layer-range", nargs=2, type=int, metavar=("START", "END"),
                   default=(-1, -1), help="layers the control vectors apply to, both inclusive (default: all from 1)")


def adapter_config(args) -> AdapterConfig | None:
    if not args.lora and not args.control_vectors:
        return None
    return AdapterConfig(lora=tuple(args.lora), control_vectors=tuple(args.control_vectors),
                         control_layers=tuple(args.control_vector_layer_range))
