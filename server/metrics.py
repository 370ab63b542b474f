"""Prometheus metrics of one server, in its own registry (several apps may
live in one process, as in tests)."""
from __future__ import annotations

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "ggserve_requests", "HTTP requests by endpoint and status",
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
        return generate_latest(self.registry)
