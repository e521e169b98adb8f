"""Several rollout replicas behind one ``services.rollout`` setting: addresses, clients, shards.

``services.rollout`` is one target or a list of targets; each target is

* ``HOST:PORT`` (or ``[IPV6]:PORT``): one replica, always a member. When it is down the trainer waits for it
  with backoff, as it did for a single service;
* ``dns:///NAME:PORT``: every address ``NAME`` resolves to (``socket.getaddrinfo``) is a replica. A Kubernetes
  headless Service answers with one A record per *ready* pod, so resolving again at every step follows the
  Deployment as it scales: a new pod is a new member (it gets the current weights before it generates), a pod
  that DNS stops listing is dropped. A name that resolves to nothing (no ready pod) contributes no member;
* ``unix:PATH`` (or another gRPC URI scheme except ``dns:``): one replica, passed to gRPC as it is.

Only one address family of a DNS answer is used: IPv4 when there is any A record, else IPv6. A dual-stack
Service lists every pod once per family, and the same pod twice would get every version twice (refused: a
version must increase) and two shards of the batch.

Generation splits a batch of prompt groups into contiguous shards, one per replica (:func:`shard_bounds`), so
the ``n`` completions of a prompt come from one engine, and :func:`merge_shards` concatenates the shards'
completions back in the original prompt-major order.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from grpo_runtime.client import ChannelConfig
from grpo_runtime.retry import is_retryable
from rollout_service.client import RolloutClient
from trainer_service.config.rollout_targets import parse_target

log = logging.getLogger(__name__)

T = TypeVar("T")


class RolloutUnavailable(RuntimeError):
    """A rollout replica could not be reached (down, restarting, or no replica at all); retry later."""


def may_recover(error: BaseException) -> bool:
    """A failure that waiting may fix: a retryable call error of a replica, or no replica to call now."""
    return isinstance(error, RolloutUnavailable) or is_retryable(error)


@dataclass(frozen=True)
class ReplicaAddress:
    """One replica: the gRPC target of its channel, and the TLS name to check (the DNS name it came from)."""

    address: str
    server_name: str | None = None


def _format(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def resolve_name(name: str, port: int) -> list[str]:
    """``ip:port`` of every address ``name`` resolves to, one family (IPv4 first), sorted; [] when none.

    A headless Service without ready pods answers NXDOMAIN, which is "no replica now", not an error.
    """
    try:
        answers = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        log.warning("rollout replicas: %s does not resolve (%s)", name, error)
        return []
    by_family: dict[int, set[str]] = {}
    for family, _, _, _, sockaddr in answers:
        if family in (socket.AF_INET, socket.AF_INET6):
            by_family.setdefault(family, set()).add(str(sockaddr[0]))
    ips = by_family.get(socket.AF_INET) or by_family.get(socket.AF_INET6) or set()
    return [_format(ip, port) for ip in sorted(ips, key=ipaddress.ip_address)]


def resolve_targets(targets: Sequence[str]) -> list[ReplicaAddress]:
    """The replicas of ``targets`` now: fixed entries as they are, DNS names resolved; duplicates dropped
    (first one kept), order = the targets' order, then sorted addresses within a name."""
    replicas: list[ReplicaAddress] = []
    seen: set[str] = set()
    for text in targets:
        target = parse_target(text)
        if target.dns_name is None:
            found = [ReplicaAddress(target.text)]
        else:
            assert target.port is not None
            found = [ReplicaAddress(a, target.dns_name) for a in resolve_name(target.dns_name, target.port)]
        for replica in found:
            if replica.address not in seen:
                seen.add(replica.address)
                replicas.append(replica)
    return replicas


def settle(calls: Sequence[Callable[[], T]]) -> list[T | Exception]:
    """Run ``calls`` concurrently (one thread each; inline when there is one) and wait for all of them.

    Returns each call's result or the exception it raised, in the order of ``calls``, so the caller decides
    what a partial failure means. gRPC calls release the GIL while they wait, so the threads overlap.
    """
    if len(calls) <= 1:
        outcomes: list[T | Exception] = []
        for call in calls:
            try:
                outcomes.append(call())
            except Exception as error:
                outcomes.append(error)
        return outcomes
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="rollout-replica") as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.exception() or future.result() for future in futures]  # type: ignore[misc]


def first_error(outcomes: Sequence[Any]) -> Exception | None:
    """The first exception among :func:`settle` outcomes, or None."""
    return next((o for o in outcomes if isinstance(o, Exception)), None)


def shard_bounds(counts: Sequence[int], shards: int) -> list[tuple[int, int]]:
    """Split groups with ``counts[i]`` completions into at most ``shards`` contiguous, non-empty slices
    ``[start, end)`` of near-equal completion totals.

    Group i goes to shard ``floor(k · (c_<i + c_i / 2) / C)``, with ``c_<i`` the completions before it,
    ``C = Σ c`` and ``k = shards``: its midpoint's position in the batch. The shard index never decreases
    along the batch, so shards are contiguous; with equal groups (the usual G each) shard sizes differ by at
    most one group. Fewer groups than shards leave the extra replicas idle.
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    total = sum(counts)
    if not counts:
        return []
    owner = []
    before = 0
    for count in counts:
        owner.append(min(shards - 1, (2 * before + count) * shards // (2 * total)) if total else 0)
        before += count
    bounds: list[tuple[int, int]] = []
    start = 0
    for index in range(1, len(counts) + 1):
        if index == len(counts) or owner[index] != owner[start]:
            bounds.append((start, index))
            start = index
    return bounds


def merge_shards(
    parts: Sequence[Sequence[T]], bounds: Sequence[tuple[int, int]], counts: Sequence[int]
) -> list[T]:
    """Concatenate the shards' completions (shard order = batch order); each shard must hold exactly the
    completions of its groups, ``Σ counts[start:end]``."""
    merged: list[T] = []
    for part, (start, end) in zip(parts, bounds, strict=True):
        expected = sum(counts[start:end])
        if len(part) != expected:
            raise RuntimeError(
                f"a rollout replica returned {len(part)} completions for a shard of {expected}"
            )
        merged.extend(part)
    return merged


class RolloutReplicas:
    """The rollout replicas a run talks to: one :class:`RolloutClient` per member address.

    ``targets``: the ``services.rollout`` entries; ``channel``: the channel settings every member's channel
    copies (token, TLS, deadline), with its own ``target`` and, for DNS members under TLS, the DNS name as the
    certificate name to check (the certificate names the Service, not the pod IP).

    The main process calls :meth:`refresh` (resolve, then :meth:`adopt`); other ranks :meth:`adopt` the list
    the main process shares, so every rank generates on the same members. A dropped member's client is
    closed one membership change later, so a generation running in another thread (async prefetch) finishes
    on it rather than failing.
    """

    def __init__(self, targets: Sequence[str], channel: ChannelConfig):
        self.targets = [parse_target(t).text for t in targets]
        if not self.targets:
            raise ValueError("at least one rollout target is needed")
        self.channel = channel
        self._clients: dict[str, RolloutClient] = {}
        self._retired: dict[str, RolloutClient] = {}
        self._lock = threading.Lock()

    def resolve(self) -> list[ReplicaAddress]:
        """The replicas the targets name now (DNS resolved again)."""
        return resolve_targets(self.targets)

    def refresh(self) -> list[ReplicaAddress]:
        """Resolve the targets and make the answer the membership; returns it (may be empty)."""
        return self.adopt(self.resolve())

    def adopt(self, members: Sequence[ReplicaAddress]) -> list[ReplicaAddress]:
        """Make ``members`` the membership: clients for new addresses, retire those no longer listed."""
        members = list(members)
        with self._lock:
            wanted = {m.address: m for m in members}
            stale = dict(self._retired)
            clients: dict[str, RolloutClient] = {}
            for address, replica in wanted.items():
                known = self._clients.get(address) or stale.pop(address, None)
                if known is None:
                    log.info("rollout replica %s joined", address)
                clients[address] = known or self._open(replica)
            self._retired = {a: c for a, c in self._clients.items() if a not in wanted}
            for address in self._retired:
                log.info("rollout replica %s left the membership", address)
            self._clients = clients
        for client in stale.values():
            client.close()
        return members

    def _open(self, replica: ReplicaAddress) -> RolloutClient:
        update: dict[str, Any] = {"target": replica.address}
        if replica.server_name and self.channel.secure and self.channel.tls_server_name is None:
            update["tls_server_name"] = replica.server_name
        return RolloutClient(self.channel.model_copy(update=update))

    def client(self, address: str) -> RolloutClient:
        """The client of a member (or of one dropped at the last change); RolloutUnavailable when unknown."""
        with self._lock:
            found = self._clients.get(address) or self._retired.get(address)
        if found is None:
            raise RolloutUnavailable(f"rollout replica {address} is no longer a member")
        return found

    def close(self) -> None:
        with self._lock:
            clients = [*self._clients.values(), *self._retired.values()]
            self._clients, self._retired = {}, {}
        for client in clients:
            client.close()
