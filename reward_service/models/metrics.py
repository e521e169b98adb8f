"""Prometheus view of the loaded reward models and their batchers.

Register it on the server's registry (``server.metrics.registry.register(ModelMetrics(models))``);
values are read from the live registry at scrape time, so swaps and unloads need no bookkeeping:

- ``grpo_reward_model_forwards_total{model}``: padded forwards run by the current version;
- ``grpo_reward_model_sequences_total{model}``: sequences scored by the current version;
- ``grpo_reward_model_largest_batch{model}``: most sequences in one forward;
- ``grpo_reward_model_padded_tokens_total{model}``: tokens the batched forwards computed (B x T,
  padding included, shared prefixes excluded);
- ``grpo_reward_model_prefix_tokens_total{model}``: tokens of shared prefixes computed (once each);
- ``grpo_reward_model_version{model}``: version number of the loaded model.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from reward_service.models.registry import ModelRegistry


class ModelMetrics(Collector):
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        forwards = CounterMetricFamily(
            "grpo_reward_model_forwards", "Padded forwards run by the loaded version.", labels=["model"]
        )
        sequences = CounterMetricFamily(
            "grpo_reward_model_sequences", "Sequences scored by the loaded version.", labels=["model"]
        )
        largest = GaugeMetricFamily(
            "grpo_reward_model_largest_batch", "Most sequences in one forward.", labels=["model"]
        )
        padded = CounterMetricFamily(
            "grpo_reward_model_padded_tokens",
            "Tokens computed by the batched forwards, padding included, shared prefixes excluded.",
            labels=["model"],
        )
        prefix = CounterMetricFamily(
            "grpo_reward_model_prefix_tokens", "Tokens of shared prefixes computed.", labels=["model"]
        )
        version = GaugeMetricFamily("grpo_reward_model_version", "Loaded model version.", labels=["model"])
        for info in self._registry.list():
            stats = self._registry.batcher_stats(info.name)
            label = [info.reward_name]
            forwards.add_metric(label, stats["forward_calls"])
            sequences.add_metric(label, stats["sequences"])
            largest.add_metric(label, stats["largest_batch"])
            padded.add_metric(label, stats["padded_tokens"])
            prefix.add_metric(label, stats["prefix_tokens"])
            version.add_metric(label, info.version)
        yield from (forwards, sequences, largest, padded, prefix, version)
