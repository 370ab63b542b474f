"""The physical limit of decode on a CPU: a step reads every weight it multiplies once,
so tokens/s can be no more than the memory's read speed over those bytes.

    python bench/read_limit.py -m MODEL.gguf [-t THREADS]

Bytes a decode token reads (`decode_bytes`): every matrix of the file except the token
embedding (a lookup reads one row of it) unless the LM head is that same matrix (tied),
and of an expert stack (`*_exps`) the share the router picks (expert_used_count of
expert_count). The read speed: bench/read_bandwidth.c, compiled here with the system's
C compiler, at the same thread count (`read_bandwidth`). bench/engine.py --read-limit
prints both engines' tg as a share of this limit, measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import gguf

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "read_bandwidth.c")


def decode_bytes(model: str) -> int:
    r = gguf.GGUFReader(model)
    arch = r.fields["general.architecture"].contents()
    field = lambda k: r.fields[f"{arch}.{k}"].contents() if f"{arch}.{k}" in r.fields else None
    n_expert, n_used = field("expert_count"), field("expert_used_count")
    names = {t.name for t in r.tensors}
    total = 0
    for t in r.tensors:
        if len(t.shape) < 2 or t.tensor_type == gguf.GGMLQuantizationType.F32:
            continue              # norms, biases, router matrices: small, read as they are
        if t.name == "token_embd.weight" and "output.weight" in names:
            continue              # a lookup reads one row
        n = int(t.n_bytes)
        if "_exps." in t.name and n_expert:
            n = n * n_used // n_expert
        total += n
    return total


def read_bandwidth(threads: int, mib: int = 1024, reps: int = 8) -> float:
    """GB/s that `threads` threads stream from memory (best of reps passes over mib MiB)."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build bench/read_bandwidth.c")
    with tempfile.TemporaryDirectory() as d:
        exe = os.path.join(d, "read_bandwidth")
        subprocess.run([cc, "-O3", "-march=native", "-fopenmp", _SOURCE, "-o", exe], check=True)
        out = subprocess.run([exe, str(mib), str(reps), str(threads)], check=True, capture_output=True, text=True)
    return float(out.stdout)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", required=True)
    p.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    a = p.parse_args(argv)
    nbytes = decode_bytes(a.model)
    gbs = read_bandwidth(a.threads)
    print(f"{os.path.basename(a.model)}: a decode token reads {nbytes / 1e6:.0f} MB; {a.threads} threads read "
          f"{gbs:.1f} GB/s: at most {gbs * 1e9 / nbytes:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
