"""llama-server's logging flags: --log-disable, --log-file, -lv/--verbosity, --log-colors,
--log-prefix, --log-timestamps, --log-jsonl; `setup_logging` applies them to Python's
logging and says how uvicorn should log."""
from __future__ import annotations

import argparse
import json
import logging
import sys

# llama.cpp's verbosity levels: 0 generic output, 1 error, 2 warning, 3 info, 4 trace, 5 debug;
# a message is shown when its level is at most the threshold
VERBOSITY = {0: logging.CRITICAL, 1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG}


def add_log_flags(p) -> None:
    p.add_argument("--log-disable", action="store_true", help="log nothing (errors that stop the server still print)")
    p.add_argument("--log-file", metavar="FNAME", help="log to this file as well")
    p.add_argument("-lv", "--verbosity", "--log-verbosity", type=int, default=None, metavar="N",
                   help="log messages up to this level: 0 generic, 1 error, 2 warning, 3 info (default), "
                        "4 trace, 5 debug (-v: everything)")
    p.add_argument("--log-colors", type=str.lower, choices=("on", "off", "auto"), default="auto",
                   help="color the HTTP server's log lines: on, off, or auto (on a terminal)")
    p.add_argument("--log-prefix", action=argparse.BooleanOptionalAction, default=True,
                   help="start each log line with its level and logger")
    p.add_argument("--log-timestamps", action=argparse.BooleanOptionalAction, default=True,
                   help="start each log line with its time")
    p.add_argument("--log-jsonl", action=argparse.BooleanOptionalAction, default=False,
                   help="log one JSON object per line (time, level, logger, message)")


class JSONLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({"time": self.formatTime(record), "level": record.levelname.lower(),
                           "logger": record.name, "message": record.getMessage()}, ensure_ascii=False)


def setup_logging(args) -> dict:
    """Configure the root logger from the flags; -> keyword arguments for uvicorn.Config."""
    if args.verbose:
        level = logging.DEBUG
    elif args.verbosity is not None:
        level = VERBOSITY.get(min(max(args.verbosity, 0), 4))
    else:
        level = logging.INFO
    if args.log_disable:
        level = logging.CRITICAL + 1
    if args.log_jsonl:
        formatter = JSONLines()
    else:
        fmt = ("%(asctime)s " if args.log_timestamps else "") + \
              ("%(levelname)s %(name)s: " if args.log_prefix else "") + "%(message)s"
        formatter = logging.Formatter(fmt)
    handlers = [logging.StreamHandler(sys.stderr)]
    if args.log_file:
        handlers.append(logging.FileHandler(args.log_file, encoding="utf-8"))
    for h in handlers:
        h.setFormatter(formatter)
    logging.basicConfig(level=level, handlers=handlers, force=True)
    kw = {"log_level": "critical" if args.log_disable else logging.getLevelName(level).lower()}
    if args.log_disable or args.log_file or args.log_jsonl or not (args.log_prefix and args.log_timestamps):
        kw["log_config"] = None          # uvicorn's loggers go through the handlers above
    elif args.log_colors != "auto":
        kw["use_colors"] = args.log_colors == "on"
    return kw
