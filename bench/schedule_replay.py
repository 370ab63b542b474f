"""Replay a burst of requests through the step scheduler with a model of the step's
cost (fixed + per_row * rows seconds), no model and no engine: what the schedule does
to times to first token and to the gaps between a stream's tokens.

    python bench/schedule_replay.py [--fixed 0.06] [--per-row 0.0095] [--stall-ms -1]
                                    [--prompts 30,210,800,30,210,800,30,210] [--slots 4]

The defaults: bench/serve.py's `text` workload at 8 streams (its 30/210/800-token
prompts in turn, 32 tokens out) on a Llama-3.2-1B-shaped Q4_K_M with 2 threads (about
60 ms + 9.5 ms a row a step), llama-server's 4 slots. `--scheduler PATH` replays
another version of server/engine/scheduler.py (e.g. `git show REV:server/engine/scheduler.py`).
A model of the steps, not a measurement: bench/serve.py measures.
"""
from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import envelope, write_json  # noqa: E402

from ggserve.server.engine.sequence import Request, Sequence  # noqa: E402


def replay(scheduler_cls, prompts: list[int], slots: int, n_out: int, fixed: float, per_row: float,
           stall_s: float) -> dict:
    sched = scheduler_cls(slots, 512, max_stall_s=stall_s)
    for i, n in enumerate(prompts):
        sched.add(Sequence(Request(f"r{i}", list(range(n)))))
    t, steps, first, last, gaps, out = 0.0, 0, {}, {}, [], {}
    while sched.has_work():
        sched.admit()
        chunks = sched.schedule()
        rows = sum(c.n for c in chunks)
        dt = fixed + per_row * rows
        t, steps = t + dt, steps + 1
        sched.observe(rows, dt, dt)
        for c in chunks:
            s = c.seq
            s.n_computed += c.n
            if not c.wants_logits:
                continue
            s.tokens.append(1)
            out[s.id] = out.get(s.id, 0) + 1
            if s.id in last:
                gaps.append(t - last[s.id])
            first.setdefault(s.id, t)
            last[s.id] = t
            if out[s.id] >= n_out:
                sched.remove(s.id)
    gaps.sort()
    return {"steps": steps, "wall_s": t, "ttft_p50_s": statistics.median(first.values()),
            "itl_p99_s": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], "itl_max_s": gaps[-1]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", default="30,210,800,30,210,800,30,210", help="prompt tokens per request")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--fixed", type=float, default=0.06, help="seconds a step costs whatever its rows")
    p.add_argument("--per-row", type=float, default=0.0095, help="seconds a row adds")
    p.add_argument("--stall-ms", type=float, default=-1.0, help="as ggserve serve's --max-stall-ms")
    p.add_argument("--scheduler", help="another scheduler.py to replay beside this checkout's")
    p.add_argument("--out", default="bench/results/schedule_replay.json")
    a = p.parse_args(argv)
    from ggserve.server.engine.scheduler import Scheduler
    versions = {"this checkout": Scheduler}
    if a.scheduler:
        loader = importlib.machinery.SourceFileLoader("other_scheduler", a.scheduler)   # any file name
        spec = importlib.util.spec_from_loader("other_scheduler", loader)
        mod = sys.modules["other_scheduler"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        versions[a.scheduler] = mod.Scheduler
    prompts = [int(x) for x in a.prompts.split(",")]
    results = []
    for name, cls in versions.items():
        r = {"scheduler": name, **replay(cls, prompts, a.slots, a.max_tokens, a.fixed, a.per_row, a.stall_ms / 1000)}
        results.append(r)
        print(f"{name}: {r['steps']} steps, wall {r['wall_s']:.1f} s, TTFT p50 {r['ttft_p50_s']:.1f} s, "
              f"ITL p99 {r['itl_p99_s']:.2f} s, max {r['itl_max_s']:.2f} s")
    write_json(a.out, envelope("schedule_replay", vars(a), results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
