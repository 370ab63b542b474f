"""The models a router serves, found as llama-server 11434 finds them: GGUF files in the
Hugging Face cache llama.cpp downloads into (`repo:TAG` ids), a `--models-dir` (a file per
model, or a subfolder per model with its `mmproj*.gguf` and split shards), and the
sections of a `--models-preset` INI file (server/router/presets.py). A model found twice
takes the last source's place: cache < models-dir < preset."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

# llama.cpp's common/download.cpp get_gguf_split_info: `<prefix>-0000N-of-0000M` and a quant tag
_SPLIT = re.compile(r"^(.+)-([0-9]{5})-of-([0-9]{5})$", re.I)
_TAG = re.compile(r"[-.]([A-Z0-9_]+)$", re.I)
_COMPANIONS = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")


@dataclass
class ModelSpec:
    """One model the router can start: its id and the flags of its own `ggserve serve`."""

    id: str
    args: list[str] = field(default_factory=list)   # flags from its source ([*] and its preset section)
    source: str = "models_dir"                       # models_dir | preset | cache
    path: str | None = None                          # its GGUF file, where known before it loads
    load_on_startup: bool = False
    stop_timeout: float = 10.0                       # seconds a stop waits before killing it
    hidden: bool = False                             # a cache entry a deduplicating preset stands for
    dedup: bool = False                              # dedup-cache-models: hide the cache entries it uses
    cache_ids: list[str] = field(default_factory=list)   # the cache entries (repo:TAG) its hf keys name


def split_info(name: str) -> tuple[str, str, int]:
    """A GGUF file name -> (prefix, TAG, shard index); index 0 if not a .gguf file."""
    if not name.endswith(".gguf"):
        return "", "", 0
    prefix, index = name[:-5], 1
    m = _SPLIT.match(prefix)
    if m:
        prefix, index = m.group(1), int(m.group(2))
    tag = _TAG.search(prefix)
    return prefix, tag.group(1).upper() if tag else "", index


def _is_companion(name: str) -> bool:
    return "mmproj" in name or any(name.startswith(p) for p in _COMPANIONS[1:])


def scan_models_dir(path: str) -> list[ModelSpec]:
    """--models-dir as llama-server reads it: `name.gguf` is model `name`; a subfolder is one
    model named after it (its first shard, its mmproj)."""
    if not os.path.isdir(path):
        raise ValueError(f"--models-dir: {path!r} does not exist or is not a directory")
    out = []
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if entry.is_dir():
            spec = _scan_subdir(entry.path, entry.name)
            if spec:
                out.append(spec)
        elif entry.is_file() and entry.name.endswith(".gguf") and not _is_companion(entry.name):
            out.append(ModelSpec(entry.name[:-5], ["-m", entry.path], path=entry.path))
    return out


def _scan_subdir(path: str, name: str) -> ModelSpec | None:
    model = first_shard = mmproj = None
    for entry in sorted(os.scandir(path), key=lambda e: e.name):
        if not entry.is_file() or not entry.name.endswith(".gguf"):
            continue
        if "mmproj" in entry.name:
            mmproj = entry.path
        elif _is_companion(entry.name):
            continue
        elif "-00001-of-" in entry.name:
            first_shard = entry.path
        else:
            model = entry.path
    main = first_shard or model
    if main is None:
        return None
    return ModelSpec(name, ["-m", main] + (["--mmproj", mmproj] if mmproj else []), path=main)


def hf_cache_dir() -> str:
    """Where llama.cpp keeps downloads (common/hf-cache.cpp's order of variables)."""
    for var, sub in (("LLAMA_CACHE", ""), ("HF_HUB_CACHE", ""), ("HUGGINGFACE_HUB_CACHE", ""),
                     ("HF_HOME", "hub"), ("XDG_CACHE_HOME", "huggingface/hub")):
        if os.environ.get(var):
            return os.path.join(os.environ[var], sub) if sub else os.environ[var]
    return os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")


def _cached_ref(repo_dir: str) -> str | None:
    refs = os.path.join(repo_dir, "refs")
    if not os.path.isdir(refs):
        return None
    commits = {}
    for name in sorted(os.listdir(refs)):
        with open(os.path.join(refs, name)) as f:
            commit = f.readline().strip()
        if re.fullmatch(r"[0-9a-f]{40}", commit):
            commits[name] = commit
    return commits.get("main") or next(iter(commits.values()), None)


def cached_files(cache: str) -> dict[str, list[tuple[str, str]]]:
    """repo id -> [(path in the repo, local path)] of each cached repo's current snapshot."""
    out: dict[str, list[tuple[str, str]]] = {}
    if not os.path.isdir(cache):
        return out
    for folder in sorted(os.listdir(cache)):
        if not folder.startswith("models--"):
            continue
        repo_dir = os.path.join(cache, folder)
        commit = _cached_ref(repo_dir)
        snap = os.path.join(repo_dir, "snapshots", commit or "")
        if commit is None or not os.path.isdir(snap):
            continue
        files = []
        for root, _, names in os.walk(snap):
            for n in sorted(names):
                local = os.path.join(root, n)
                files.append((os.path.relpath(local, snap).replace(os.sep, "/"), local))
        out[folder[len("models--"):].replace("--", "/")] = files
    return out


def resolve_cached(cache: str, repo_tag: str) -> tuple[str, str | None] | None:
    """`org/repo[:TAG]` -> (its model file, its mmproj or None) in the cache; None if absent."""
    repo, _, tag = repo_tag.partition(":")
    files = cached_files(cache).get(repo, [])
    models = [(rel, local) for rel, local in files if split_info(os.path.basename(rel))[2] == 1
              and not _is_companion(os.path.basename(rel))]
    if tag:
        models = [m for m in models if split_info(os.path.basename(m[0]))[1] == tag.upper()]
    if not models:
        return None
    mmproj = next((local for rel, local in files if "mmproj" in os.path.basename(rel)), None)
    return models[0][1], mmproj


def scan_cache(cache: str) -> list[ModelSpec]:
    """Every `repo:TAG` of the cache, as llama.cpp's common_list_cached_models lists them."""
    out, seen = [], set()
    for repo, files in cached_files(cache).items():
        for rel, local in files:
            prefix, tag, index = split_info(os.path.basename(rel))
            if index != 1 or not tag or _is_companion(os.path.basename(rel)):
                continue
            mid = f"{repo}:{tag}"
            if mid in seen:
                continue
            seen.add(mid)
            mmproj = resolve_cached(cache, mid)[1]
            out.append(ModelSpec(mid, ["-m", local] + (["--mmproj", mmproj] if mmproj else []),
                                 source="cache", path=local))
    return out
