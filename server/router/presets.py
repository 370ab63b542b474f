"""--models-preset: llama-server 11434's INI file of models (common/preset.cpp).

    [*]                      ; every model
    ctx-size = 4096
    [chat-small]             ; a model named by its section
    model = /models/smollm2.gguf
    temp = 0.7
    load-on-startup = true
    [gemma]
    hf-repo = ggml-org/gemma-3-270m-GGUF     ; a file already in llama.cpp's download cache
    LLAMA_ARG_N_GPU_LAYERS = 99

A key is a `ggserve serve` flag by its long or short name without dashes, or its
LLAMA_ARG_* variable; a flag without a value takes `true`/`false`. The router's own keys:
`model`, `load-on-startup`, `stop-timeout`, `hf-repo` (`hf`), `hf-repo-draft`
(`spec-draft-hf`), `dedup-cache-models`. Any other key stops the server at start, named.
"""
from __future__ import annotations

import configparser
import os
from dataclasses import dataclass

from ggserve.server.router.catalog import ModelSpec, resolve_cached, split_info

_TRUE, _FALSE = ("true", "1", "on", "yes", "enabled"), ("false", "0", "off", "no", "disabled")
_ROUTER_KEYS = {"load-on-startup", "stop-timeout", "dedup-cache-models"}
_HF_KEYS = {"hf-repo": "model", "hf": "model", "hfr": "model", "llama_arg_hf_repo": "model",
            "hf-repo-draft": "draft", "spec-draft-hf": "draft", "hfd": "draft", "hfrd": "draft"}
# what the router itself decides for every child: refused in a section
_RESERVED = {"--host", "--port", "--api-key", "--api-key-file", "--alias"}


class PresetError(ValueError):
    pass


@dataclass(frozen=True)
class Flag:
    option: str          # the long option string, e.g. --ctx-size
    takes_value: bool


def flag_table(parser) -> dict[str, Flag]:
    """Every name a preset key may use -> its flag: long and short names without dashes, env names."""
    table = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = Flag(max(action.option_strings, key=len), action.nargs != 0)
        for s in action.option_strings:
            table[s.lstrip("-")] = flag
        if getattr(action, "env", None):
            table[action.env.lower()] = flag
    return table


def read_preset(path: str, table: dict[str, Flag], cache: str) -> tuple[list[ModelSpec], list[str], bool]:
    """-> (the file's models, the `[*]` flags every model gets, whether `[*]` asks dedup-cache-models)."""
    ini = configparser.ConfigParser(interpolation=None, strict=False, comment_prefixes=("#", ";"),
                                    inline_comment_prefixes=(";", "#"), default_section="\0none")
    ini.optionxform = str
    try:
        with open(path, encoding="utf-8") as f:
            ini.read_file(f)
    except (OSError, configparser.Error) as e:
        raise PresetError(f"--models-preset {path}: {e}") from None
    common = _section(path, "*", ini["*"], table, cache) if ini.has_section("*") else ModelSpec("*")
    specs = [_section(path, name, ini[name], table, cache) for name in ini.sections() if name != "*"]
    for s in specs:
        s.args = common.args + s.args
        if not _given(ini, s.id, "load-on-startup"):
            s.load_on_startup = common.load_on_startup
        if not _given(ini, s.id, "stop-timeout"):
            s.stop_timeout = common.stop_timeout
    return specs, common.args, common.dedup


def _given(ini, section: str, key: str) -> bool:
    return any(k.lower() == key for k in ini[section])


def _section(path: str, name: str, items, table: dict[str, Flag], cache: str) -> ModelSpec:
    spec = ModelSpec(name, source="preset")
    for key, value in items.items():
        k = key.lower()
        where = f"--models-preset {path}: [{name}] {key}"
        if k == "model" or k == "m" or k == "llama_arg_model":
            spec.args += ["-m", value]
            spec.path = value
        elif k in _HF_KEYS:
            found = resolve_cached(cache, value)
            if found is None:
                raise PresetError(f"{where}: {value!r} is not in the download cache ({cache}); "
                                  "ggserve does not download models")
            spec.cache_ids.append(f"{value.partition(':')[0]}:{split_info(os.path.basename(found[0]))[1]}")
            if _HF_KEYS[k] == "model":
                spec.args += ["-m", found[0]] + (["--mmproj", found[1]] if found[1] else [])
                spec.path = found[0]
            else:
                spec.args += ["-md", found[0]]
        elif k in _ROUTER_KEYS:
            _router_key(spec, k, value, where)
        elif k in table and table[k].option not in _RESERVED:
            spec.args += _flag_args(table[k], value, where)
        elif k in table:
            raise PresetError(f"{where}: the router sets {table[k].option} for each model itself")
        else:
            raise PresetError(f"{where}: unknown key {key!r} (a `ggserve serve` flag without dashes, "
                              "its LLAMA_ARG_* name, or model, load-on-startup, stop-timeout)")
    return spec


def _truth(value: str, where: str) -> bool:
    if value.strip().lower() in _TRUE:
        return True
    if value.strip().lower() in _FALSE:
        return False
    raise PresetError(f"{where}: expected true or false, got {value!r}")


def _router_key(spec: ModelSpec, key: str, value: str, where: str) -> None:
    if key == "load-on-startup":
        spec.load_on_startup = _truth(value, where)
    elif key == "dedup-cache-models":
        spec.dedup = _truth(value, where)
    else:
        try:
            spec.stop_timeout = float(value)
        except ValueError:
            raise PresetError(f"{where}: expected a number of seconds, got {value!r}") from None


def _flag_args(flag: Flag, value: str, where: str) -> list[str]:
    if flag.takes_value:
        return [flag.option, value]
    return [flag.option] if _truth(value, where) else []
