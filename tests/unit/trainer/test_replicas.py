"""Rollout replicas: target parsing and config errors, address resolution, shards and their merge, the
concurrent fan-out, and the membership of clients (no server needed: channels connect lazily)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from grpo_runtime.client import ChannelConfig
from trainer_service.config.rollout_targets import parse_target
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.rollout.replicas import (
    ReplicaAddress,
    RolloutReplicas,
    RolloutUnavailable,
    first_error,
    merge_shards,
    resolve_targets,
    settle,
    shard_bounds,
)

MINIMAL = {"base": "models/policy", "data": {"train": "train.jsonl"}}


def with_rollout(value) -> dict:
    return {**MINIMAL, "services": {"rollout": value}}


# ---------------------------------------------------------------- targets and config


@pytest.mark.parametrize(
    ("text", "dns_name", "port"),
    [
        ("127.0.0.1:50052", None, None),
        ("rollout.grpo.svc.cluster.local:50052", None, None),
        ("[::1]:50052", None, None),
        (
            "dns:///rollout-headless.grpo.svc.cluster.local:50052",
            "rollout-headless.grpo.svc.cluster.local",
            50052,
        ),
        ("dns:///[::1]:7", "::1", 7),
        ("unix:/run/rollout.sock", None, None),
    ],
)
def test_targets_that_parse(text, dns_name, port):
    target = parse_target(text)
    assert (target.text, target.dns_name, target.port) == (text, dns_name, port)
    assert target.dynamic is (dns_name is not None)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "non-empty"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:0", "port between 1 and 65535"),
        ("127.0.0.1:http", "port between"),
        ("::1:50052", "IPv6 address in brackets"),
        ("dns://8.8.8.8/rollout:50052", "three slashes"),
        ("dns:rollout:50052", "three slashes"),
        ("dns:///rollout", "NAME:PORT"),
        ("ipv4:10.0.0.1:1,10.0.0.2:1", "YAML list"),
        (" 127.0.0.1:1", "white space"),
    ],
)
def test_targets_that_are_refused(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_target(text)


def test_rollout_accepts_one_address_or_a_list():
    assert parse_config(with_rollout("127.0.0.1:1")).services.rollout == ["127.0.0.1:1"]
    listed = ["127.0.0.1:1", "dns:///localhost:2"]
    assert parse_config(with_rollout(listed)).services.rollout == listed
    assert parse_config(MINIMAL).services.rollout is None
    yaml_text = "base: m\ndata: {train: t}\nservices:\n  rollout:\n    - 127.0.0.1:1\n    - 127.0.0.1:2\n"
    assert parse_config(yaml_text).services.rollout == ["127.0.0.1:1", "127.0.0.1:2"]


@pytest.mark.parametrize(
    ("value", "key", "fragment"),
    [
        ("nohost", "services.rollout", "HOST:PORT"),
        (["127.0.0.1:1", "dns://x/y:1"], "services.rollout[1]", "three slashes"),
        (["127.0.0.1:1", 5], "services.rollout[1]", "valid string"),
        ([], "services.rollout", "at least 1"),
        (["127.0.0.1:1", "127.0.0.1:1"], "services.rollout", "twice (entries 0 and 1)"),
        (5, "services.rollout", "list of addresses"),
    ],
)
def test_rollout_errors_name_the_entry(value, key, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config(with_rollout(value))
    assert caught.value.key == key
    assert str(caught.value).startswith(f"{key}: ") and fragment in str(caught.value)


# ---------------------------------------------------------------- resolution


def test_fixed_addresses_resolve_to_themselves_in_order():
    assert resolve_targets(["127.0.0.1:2", "127.0.0.1:1"]) == [
        ReplicaAddress("127.0.0.1:2"),
        ReplicaAddress("127.0.0.1:1"),
    ]
    assert resolve_targets(["127.0.0.1:1"]) == [ReplicaAddress("127.0.0.1:1")]


def test_dns_target_resolves_to_ipv4_addresses_with_the_name_for_tls():
    # localhost has an A record everywhere; IPv4 wins over ::1, so one host is one replica.
    assert resolve_targets(["dns:///localhost:50052"]) == [ReplicaAddress("127.0.0.1:50052", "localhost")]
    # The same replica named twice (fixed and through DNS) is one member.
    assert resolve_targets(["127.0.0.1:7", "dns:///localhost:7", "127.0.0.1:8"]) == [
        ReplicaAddress("127.0.0.1:7"),
        ReplicaAddress("127.0.0.1:8"),
    ]


# ---------------------------------------------------------------- shards and merge


def test_equal_groups_split_into_contiguous_balanced_shards():
    assert shard_bounds([2] * 8, 2) == [(0, 4), (4, 8)]
    assert shard_bounds([2] * 8, 3) == [(0, 3), (3, 5), (5, 8)]
    assert shard_bounds([2] * 8, 1) == [(0, 8)]
    # Fewer groups than replicas: one group each, the rest idle.
    assert shard_bounds([4, 4], 3) == [(0, 1), (1, 2)]
    assert shard_bounds([], 2) == []
    # A group cut at a process boundary (1 completion) weighs less than a full one.
    assert shard_bounds([1, 3, 3, 3], 2) == [(0, 2), (2, 4)]
    with pytest.raises(ValueError):
        shard_bounds([2], 0)


@given(st.lists(st.integers(1, 16), max_size=40), st.integers(1, 8))
def test_shards_cover_the_batch_in_order(counts, shards):
    bounds = shard_bounds(counts, shards)
    assert len(bounds) <= shards
    flat = [i for start, end in bounds for i in range(start, end)]
    assert flat == list(range(len(counts)))
    assert all(end > start for start, end in bounds)


@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 8))
def test_equal_groups_differ_by_at_most_one_group(groups, size, shards):
    bounds = shard_bounds([size] * groups, shards)
    lengths = [end - start for start, end in bounds]
    assert len(bounds) == min(groups, shards)
    assert max(lengths) - min(lengths) <= 1


def test_merge_restores_prompt_major_order_and_checks_sizes():
    counts = [2, 2, 2]
    bounds = shard_bounds(counts, 2)
    batch = [f"p{i}-c{j}" for i in range(3) for j in range(2)]
    parts = [batch[2 * start : 2 * end] for start, end in bounds]
    assert merge_shards(parts, bounds, counts) == batch
    with pytest.raises(RuntimeError, match="returned 1 completions for a shard of"):
        merge_shards([parts[0], parts[1][:1]], bounds, counts)


# ---------------------------------------------------------------- fan-out


def test_settle_runs_calls_at_once_and_returns_results_and_errors_in_order():
    barrier = threading.Barrier(3, timeout=10)  # three calls meet only if they run concurrently

    def meet(value):
        def call():
            barrier.wait()
            if value == "bad":
                raise RolloutUnavailable("down")
            return value

        return call

    outcomes = settle([meet("a"), meet("bad"), meet("c")])
    assert outcomes[0] == "a" and outcomes[2] == "c"
    assert isinstance(outcomes[1], RolloutUnavailable)
    assert first_error(outcomes) is outcomes[1]
    assert settle([lambda: 1]) == [1]
    assert first_error(settle([lambda: 1])) is None


# ---------------------------------------------------------------- membership


def test_membership_follows_resolution_and_closes_dropped_clients_one_change_later():
    replicas = RolloutReplicas(["127.0.0.1:1", "dns:///localhost:2"], ChannelConfig(target="unused:1"))
    try:
        members = replicas.refresh()
        assert [m.address for m in members] == ["127.0.0.1:1", "127.0.0.1:2"]
        first = replicas.client("127.0.0.1:1")
        assert first.target == "127.0.0.1:1" and replicas.client("127.0.0.1:2").target == "127.0.0.1:2"
        # A member that DNS stops listing: dropped, but its client stays usable until the next change, so a
        # generation still running on it (async prefetch) finishes.
        kept = replicas.adopt([ReplicaAddress("127.0.0.1:2", "localhost")])
        assert [m.address for m in kept] == ["127.0.0.1:2"]
        assert replicas.client("127.0.0.1:1") is first
        replicas.adopt([ReplicaAddress("127.0.0.1:2", "localhost")])
        with pytest.raises(RolloutUnavailable, match="no longer a member"):
            replicas.client("127.0.0.1:1")
        # One that comes back gets a fresh client.
        replicas.adopt([ReplicaAddress("127.0.0.1:1"), ReplicaAddress("127.0.0.1:2", "localhost")])
        assert replicas.client("127.0.0.1:1") is not first
    finally:
        replicas.close()
    with pytest.raises(RolloutUnavailable, match="no longer a member"):
        replicas.client("127.0.0.1:2")
    with pytest.raises(ValueError):
        RolloutReplicas([], ChannelConfig(target="unused:1"))
