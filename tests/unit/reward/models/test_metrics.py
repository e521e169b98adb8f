"""Batcher counters reach Prometheus through ModelMetrics."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from reward_service.core.types import Sample
from reward_service.models.metrics import ModelMetrics
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec


async def test_metrics_follow_the_loaded_models(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=30))
    prometheus = CollectorRegistry()
    prometheus.register(ModelMetrics(registry))
    try:
        await registry.load(ModelSpec(name="p", path=str(tiny_models["prm-token"]), kind=ModelKind.PRM))
        samples = [Sample(id=str(i), completion=f"a\n\nb {i}") for i in range(3)]
        await asyncio.gather(*(registry.score("prm:p", samples, {}) for _ in range(4)))
        labels = {"model": "prm:p"}
        forwards = prometheus.get_sample_value("grpo_reward_model_forwards_total", labels)
        assert prometheus.get_sample_value("grpo_reward_model_sequences_total", labels) == 12
        assert 1 <= forwards < 4
        # The three samples of a request share the chat-templated system prompt: run once each.
        stats = registry.batcher_stats("p")
        assert (
            prometheus.get_sample_value("grpo_reward_model_prefix_tokens_total", labels)
            == (stats["prefix_tokens"])
        )
        assert stats["prefix_tokens"] > 0
        assert (
            prometheus.get_sample_value("grpo_reward_model_padded_tokens_total", labels)
            == (stats["padded_tokens"])
        )
        assert prometheus.get_sample_value("grpo_reward_model_version", labels) == 1
        await registry.unload("p")
        assert prometheus.get_sample_value("grpo_reward_model_version", labels) is None
    finally:
        await registry.close()
