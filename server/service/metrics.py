"""Prometheus metrics of one server, in its own registry (several apps may
live in one process, as in tests): ggserve's own (ggserve_*) and, beside them, the
`llamacpp:*` series llama-server 11434 exports (tools/server/server-task.cpp
to_metrics), same names, types and meanings, so dashboards built for it read these."""
from __future__ import annotations

import time

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ggserve_requests", "HTTP requests by endpoint and status (polls left out: server/api/common.py is_poll)",
            ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(
            "ggserve_prompt_tokens", "Prompt tokens received", registry=r)
        self.cached_tokens = Counter(
            "ggserve_prompt_tokens_cached", "Prompt tokens reused from the KV cache",
            registry=r)
        self.generated_tokens = Counter(
            "ggserve_generated_tokens", "Tokens generated", registry=r)
        self.queue_depth = Gauge(
            "ggserve_requests_waiting", "Sequences queued, waiting for a slot or KV space",
            registry=r)
        self.running = Gauge(
            "ggserve_requests_running", "Sequences being processed", registry=r)
        self.kv_used = Gauge("ggserve_kv_cells_used", "KV cache cells in use", registry=r)
        self.kv_total = Gauge("ggserve_kv_cells_total", "KV cache cells", registry=r)
        # image tiles: found already encoded (hit) or encoded now (miss); totals from the engine
        self.image_cache_hits = Gauge(
            "ggserve_image_cache_hits_total", "Image tiles served from the embedding cache", registry=r)
        self.image_cache_misses = Gauge(
            "ggserve_image_cache_misses_total", "Image tiles that had to be encoded", registry=r)
        # speculative decoding (llama-server's spec_decode_* counters), totals from the engine
        self.spec_draft = Gauge(
            "ggserve_spec_decode_num_draft_tokens_total", "Speculative: tokens drafted", registry=r)
        self.spec_accepted = Gauge(
            "ggserve_spec_decode_num_accepted_tokens_total", "Speculative: drafted tokens the target accepted",
            registry=r)
        self.spec_drafts = Gauge(
            "ggserve_spec_decode_num_drafts_total", "Speculative: verification steps (drafts)", registry=r)
        self.spec_rate = Gauge(
            "ggserve_spec_decode_acceptance_rate", "Speculative: accepted / drafted tokens", registry=r)
        self.ttft = Histogram(
            "ggserve_time_to_first_token_seconds", "Time from request to first token",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram(
            "ggserve_inter_token_latency_seconds", "Time between tokens of one sequence",
            buckets=_LATENCY_BUCKETS, registry=r)
        self.step_seconds = Histogram(
            "ggserve_step_seconds", "Duration of one engine step",
            buckets=_LATENCY_BUCKETS, registry=r)

        self.t_start = int(time.time())         # the Process-Start-Time-Unix header
        # llama-server's series not derived from the ones above
        self.n_decode = 0             # engine steps (llama_decode calls)
        self.n_busy = 0               # sequences that got a token, summed over steps
        self.n_tokens_max = 0         # longest prompt + generation seen (less the last token)
        self._lengths: dict[str, int] = {}      # request id -> prompt + tokens so far
        self._window = (0.0, 0.0, 0.0, 0.0)     # throughput gauges average since the last scrape
        self._frozen: bytes | None = None

    def on_step(self, seconds: float, events) -> None:
        self.step_seconds.observe(seconds)
        self.n_decode += 1
        self.n_busy += len({ev.request_id for ev in events if ev.token is not None})

    def on_event(self, ev) -> None:
        if ev.token is not None:
            n = self._lengths.get(ev.request_id, ev.n_prompt - 1) + 1     # llama-server: n_past
            self._lengths[ev.request_id] = n
            self.n_tokens_max = max(self.n_tokens_max, n)
        if ev.finish_reason is not None:
            self._lengths.pop(ev.request_id, None)

    def set_engine_stats(self, stats: dict) -> None:
        self.kv_used.set(stats.get("kv_used", 0))
        self.kv_total.set(stats.get("kv_total", 0))
        self.running.set(stats.get("running", 0))
        self.queue_depth.set(stats.get("waiting", 0))
        self.image_cache_hits.set(stats.get("image_cache_hits", 0))
        self.image_cache_misses.set(stats.get("image_cache_misses", 0))
        drafted = stats.get("spec_draft_tokens", 0)
        self.spec_draft.set(drafted)
        self.spec_accepted.set(stats.get("spec_accepted_tokens", 0))
        self.spec_drafts.set(stats.get("spec_drafts", 0))
        self.spec_rate.set(stats.get("spec_accepted_tokens", 0) / drafted if drafted else 0.0)

    def render(self) -> bytes:
        return (self._frozen or generate_latest(self.registry)) + self.render_llamacpp().encode()

    def freeze(self, on: bool) -> None:
        """While the server sleeps (server/service/sleep.py), /metrics answers the ggserve_* series as
        they were when it fell asleep (as llama-server): its own scrapes do not count."""
        self._frozen = generate_latest(self.registry) if on else None

    @staticmethod
    def _value(metric, suffix: str) -> float:
        return next(s.value for m in metric.collect() for s in m.samples if s.name.endswith(suffix))

    def render_llamacpp(self) -> str:
        """llama-server's /metrics text: prompt time is arrival to first token (queueing
        included), generation time the gaps between a sequence's tokens."""
        cached = self._value(self.cached_tokens, "_total")
        prompt = max(self._value(self.prompt_tokens, "_total") - cached, 0.0)
        prompt_s = self._value(self.ttft, "_sum")
        predicted = self._value(self.generated_tokens, "_total")
        predicted_s = self._value(self.inter_token, "_sum")
        p0, ps0, g0, gs0 = self._window
        self._window = (prompt, prompt_s, predicted, predicted_s)

        def rate(n, t):
            return n / t if t > 0 else 0.0

        counters = [
            ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens", prompt),
            ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache", cached),
            ("prompt_seconds_total", "Total time spent processing prompts", prompt_s),
            ("tokens_predicted_total", "Number of generation tokens processed", predicted),
            ("tokens_predicted_seconds_total", "Total time spent generating tokens", predicted_s),
            ("n_decode_total", "Total number of llama_decode() calls, excluding speculative decoding "
                               "and multimodal decoding", self.n_decode),
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", self.n_tokens_max),
            ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
             self._value(self.spec_draft, "")),
            ("spec_decode_num_accepted_tokens_total", "Speculative: Total draft tokens accepted by the "
                                                      "target model", self._value(self.spec_accepted, "")),
            ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
             self._value(self.spec_drafts, "")),
        ]
        gauges = [
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", rate(prompt - p0, prompt_s - ps0)),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             rate(predicted - g0, predicted_s - gs0)),
            ("requests_processing", "Number of requests processing", self._value(self.running, "")),
            ("requests_deferred", "Number of requests deferred", self._value(self.queue_depth, "")),
            ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
             self.n_busy / max(self.n_decode, 1)),
        ]
        out = []
        for kind, items in (("counter", counters), ("gauge", gauges)):
            for name, help_, value in items:
                out.append(f"# HELP llamacpp:{name} {help_}\n# TYPE llamacpp:{name} {kind}\n"
                           f"llamacpp:{name} {_num(value)}\n")
        return "".join(out)


def _num(v: float) -> str:
    """As C++ streams print a double (6 significant digits): 12, 0.5, 85.7896."""
    return f"{float(v):.6g}"
