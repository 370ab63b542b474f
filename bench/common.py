"""Shared parts of the benchmarks: the JSON envelope, the environment record, statistics.

Every benchmark under bench/ writes one JSON document of this shape:

    {
      "schema": "ggserve-bench/1",
      "bench": "serve" | "engine" | ...,     # which script wrote it
      "created": "2026-01-31T12:00:00+00:00",
      "env": {...},                          # env_info(): machine, CPU, versions
      "config": {...},                       # the script's arguments, resolved
      "results": [ {...}, ... ],             # one flat record per measured cell
      ...                                    # script-specific extras (ratios, servers)
    }

Times in records are milliseconds (`*_ms`) or seconds (`*_s`), rates are per second
(`*_tps` tokens/s, `requests_per_s`), memory is MiB (`*_mb`).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
from typing import Iterable

SCHEMA = "ggserve-bench/1"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation, numpy's default; NaN if empty."""
    xs = sorted(values)
    if not xs:
        return math.nan
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_describe() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "describe", "--always", "--dirty"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return None


def env_info() -> dict:
    """Where and with what a figure was measured."""
    return {
        "host": platform.node(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
        "ggserve": _dist_version("ggserve"),
        "ggserve_git": _git_describe(),
        "libggml_python": _dist_version("libggml-python"),
        "numpy": _dist_version("numpy"),
    }


def envelope(bench: str, config: dict, results: list, **extra) -> dict:
    doc = {
        "schema": SCHEMA,
        "bench": bench,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "env": env_info(),
        "config": config,
        "results": results,
    }
    doc.update(extra)
    return doc


def _clean(x):
    """JSON has no NaN/inf: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: str, doc: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w") as f:
        json.dump(_clean(doc), f, indent=2)
        f.write("\n")
