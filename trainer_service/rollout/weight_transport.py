"""The trainer's end of the weight data plane: per replica, the fastest transport it can join.

Choice (``mode`` = ``training.rollout.weight_transport``):

- ``auto`` / ``shared_memory``: shared memory when the replica reports a ``weight_shm_dir`` whose
  token file this process reads with the same token (same host, same memory), else the stream;
- ``distributed``: shared memory as above, else a torch.distributed group this process hosts
  (rank 0 at ``tcp://<group_host>:<free port>``, gloo on CPU, nccl on CUDA) that the replicas join;
- ``grpc``: always the ``UpdateWeights`` stream.

A channel push that fails with FAILED_PRECONDITION or UNAVAILABLE (the replica restarted, lost its
channel, the group broke) is redone on the stream at once, and the replica's transport is chosen
again at the next push. Buckets: :func:`rollout_service.weight_plane.buckets.plan_buckets`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from grpo_runtime.call_errors import FailedPreconditionError, ServiceCallError, UnavailableError
from rollout_service.client import (
    DEFAULT_BUCKET_BYTES,
    BroadcastGroup,
    BucketFiles,
    BucketPlan,
    GroupSpec,
    RolloutClient,
    WeightFormat,
    WeightTransport,
    encode,
    fill_bucket,
    plan_buckets,
    shares_directory,
)
from trainer_service.local.launcher import free_port
from trainer_service.rollout.replicas import settle

log = logging.getLogger(__name__)

MODES = ("auto", "grpc", "shared_memory", "distributed")
# Channel failures after which the same weights go over the stream instead.
FALLBACK_ERRORS = (FailedPreconditionError, UnavailableError)


@dataclass(frozen=True)
class PushRecord:
    """One replica's last push: its transport, seconds from the call to the weights serving, bytes."""

    transport: WeightTransport
    seconds: float
    nbytes: int

    @property
    def gb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


class WeightTransports:
    """Pushes one set of weights to many replicas, each over its transport.

    ``bucket_bytes``: the size of a bucket. ``group_host``: the address replicas reach this process at
    for a torch.distributed group; ``backend``: "gloo" or "nccl"; ``device``: where nccl buckets live.
    """

    def __init__(
        self,
        mode: str = "auto",
        *,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        group_host: str = "127.0.0.1",
        backend: str = "gloo",
        device: str = "cpu",
        join_timeout_s: float = 60.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"weight transport {mode!r} is none of {MODES}")
        self.mode = mode
        self.bucket_bytes = bucket_bytes
        self.group_host = group_host
        self.backend = backend
        self.device = device
        self.join_timeout_s = join_timeout_s
        # address → (transport, the replica's shm token when shared memory); forgotten on a channel failure.
        self._chosen: dict[str, tuple[WeightTransport, str]] = {}
        self._open: dict[str, RolloutClient] = {}  # replicas whose channel this process opened
        self._files: dict[str, BucketFiles] = {}  # shm directory → this sender's bucket files there
        self._group: BroadcastGroup | None = None
        self._group_members: tuple[str, ...] = ()
        self._group_buffers: list[torch.Tensor] = []  # kept from push to push, like the bucket files
        self._lock = threading.Lock()  # one push at a time (the files and the group are reused)
        self.last: dict[str, PushRecord] = {}

    # ------------------------------------------------------------------------------------ choice
    def _choose(self, address: str, client: RolloutClient) -> tuple[WeightTransport, str]:
        if self.mode == "grpc":
            return WeightTransport.GRPC_STREAM, ""
        if address not in self._chosen:
            try:
                status = client.status()
            except ServiceCallError as error:  # the stream push reports the replica's state itself
                log.info("GetStatus of %s failed (%s); streaming the weights", address, error)
                return WeightTransport.GRPC_STREAM, ""
            # A status without these fields (an older replica) offers the stream only.
            offered = getattr(status, "weight_transports", ())
            shm_dir = getattr(status, "weight_shm_dir", "")
            choice = (WeightTransport.GRPC_STREAM, "")
            if (
                WeightTransport.SHARED_MEMORY in offered
                and shm_dir
                and shares_directory(shm_dir, getattr(status, "weight_shm_token", ""))
            ):
                choice = (WeightTransport.SHARED_MEMORY, shm_dir)
            elif self.mode == "distributed" and WeightTransport.TORCH_DISTRIBUTED in offered:
                choice = (WeightTransport.TORCH_DISTRIBUTED, "")
            self._chosen[address] = choice
            log.info("weight transport for %s: %s", address, choice[0].name)
        return self._chosen[address]

    def _forget(self, address: str) -> None:
        self._chosen.pop(address, None)
        self._open.pop(address, None)

    # -------------------------------------------------------------------------------------- push
    def push(
        self,
        targets: Sequence[tuple[str, RolloutClient]],
        version: int,
        state_dict: dict[str, torch.Tensor],
        adapter_config: dict[str, Any] | None,
    ) -> list[Any]:
        """Push to every target; each one's result (WeightsApplied / ChannelApplied) or exception,
        in order. Records each replica's transport and seconds in :attr:`last`."""
        with self._lock:
            return self._push(targets, version, state_dict, adapter_config)

    def _push(self, targets, version, state_dict, adapter_config) -> list[Any]:
        fmt = WeightFormat.LORA_ADAPTER if adapter_config is not None else WeightFormat.STATE_DICT
        choices = [self._choose(address, client) for address, client in targets]
        stream = _LazyPayload(state_dict)
        plan = BucketPlan((), ())
        if any(kind != WeightTransport.GRPC_STREAM for kind, _ in choices):
            try:
                plan = plan_buckets(state_dict, self.bucket_bytes)
            except ValueError as error:
                # A dtype no channel carries: the replica's answer to the stream says why.
                log.warning("weights go over the stream: %s", error)
                choices = [(WeightTransport.GRPC_STREAM, "")] * len(targets)
        outcomes: list[Any] = [None] * len(targets)
        calls: list[tuple[int, Callable[[], Any]]] = []
        shm_files: dict[str, tuple[tuple[str, ...], float] | None] = {}
        group_members = []
        for i, ((address, client), choice) in enumerate(zip(targets, choices, strict=True)):
            if choice[0] == WeightTransport.SHARED_MEMORY:
                directory = choice[1]
                if directory not in shm_files:
                    shm_files[directory] = self._write_buckets(directory, state_dict, plan)
                written = shm_files[directory]
                if written is None:  # no room in the directory: this push streams
                    calls.append(
                        (i, self._stream_call(address, client, stream, version, fmt, adapter_config))
                    )
                    continue
                files, started = written
                calls.append(
                    (
                        i,
                        self._shm_call(
                            address, client, plan, version, fmt, adapter_config, files, stream, started
                        ),
                    )
                )
            elif choice[0] == WeightTransport.TORCH_DISTRIBUTED:
                group_members.append(i)
            else:
                calls.append((i, self._stream_call(address, client, stream, version, fmt, adapter_config)))
        if group_members:
            members = [targets[i] for i in group_members]
            calls.append(
                (
                    -1,
                    lambda: self._group_push(members, plan, version, fmt, adapter_config, state_dict, stream),
                )
            )
        results = settle([call for _, call in calls])
        for (i, _), result in zip(calls, results, strict=True):
            if i >= 0:
                outcomes[i] = result
            else:
                group_results = result if isinstance(result, list) else [result] * len(group_members)
                for j, r in zip(group_members, group_results, strict=True):
                    outcomes[j] = r
        return outcomes

    def _write_buckets(
        self, directory: str, state_dict: dict[str, torch.Tensor], plan: BucketPlan
    ) -> tuple[tuple[str, ...], float] | None:
        """(bucket file names, when writing began), or None when the directory cannot hold them."""
        started = time.perf_counter()
        files = self._files.setdefault(directory, BucketFiles(directory))
        try:
            return files.write(state_dict, plan), started
        except OSError as error:
            log.warning("cannot write weight buckets into %s (%s); streaming instead", directory, error)
            files.close()
            return None

    def _timed(self, address: str, transport: WeightTransport, nbytes: int, start: float, result: Any) -> Any:
        self.last[address] = PushRecord(transport, time.perf_counter() - start, nbytes)
        return result

    def _stream_call(self, address, client, stream, version, fmt, adapter_config) -> Callable[[], Any]:
        def call() -> Any:
            start = time.perf_counter()
            payload = stream.get()
            result = client.push_weights(payload, version, fmt, adapter_config)
            return self._timed(address, WeightTransport.GRPC_STREAM, payload.nbytes, start, result)

        return call

    def _shm_call(
        self, address, client, plan, version, fmt, adapter_config, files, stream, start
    ) -> Callable[[], Any]:
        """``start``: when the buckets began to be written (the push's time includes the writing)."""

        def call() -> Any:
            try:
                if address not in self._open:
                    client.open_weight_channel(WeightTransport.SHARED_MEMORY)
                    self._open[address] = client
                result = client.push_from_channel(plan, version, fmt, adapter_config, bucket_files=files)
            except FALLBACK_ERRORS as error:
                log.warning("shared-memory push to %s failed (%s); streaming instead", address, error)
                self._forget(address)
                return self._stream_call(address, client, stream, version, fmt, adapter_config)()
            return self._timed(address, WeightTransport.SHARED_MEMORY, plan.total_bytes, start, result)

        return call

    # ----------------------------------------------------------------------------- distributed
    def _ensure_group(self, members: Sequence[tuple[str, RolloutClient]]) -> None:
        """Host a group of exactly ``members`` (re-formed when they changed); rank i+1 = members[i]."""
        addresses = tuple(address for address, _ in members)
        if self._group is not None and addresses == self._group_members:
            return
        self._close_group()
        port = free_port(self.group_host)
        spec = GroupSpec(
            f"tcp://{self.group_host}:{port}", 0, len(members) + 1, self.backend, self.join_timeout_s
        )
        joined: list[BroadcastGroup] = []

        def host() -> None:
            joined.append(BroadcastGroup(spec, self.device))

        def join(rank: int, client: RolloutClient) -> Callable[[], Any]:
            return lambda: client.open_weight_channel(
                WeightTransport.TORCH_DISTRIBUTED,
                init_method=spec.init_method,
                rank=rank,
                world_size=spec.world_size,
                backend=self.backend,
                join_timeout_s=self.join_timeout_s,
            )

        results = settle([host] + [join(r + 1, c) for r, (_, c) in enumerate(members)])
        error = next((r for r in results if isinstance(r, Exception)), None)
        if error is not None:
            if joined:
                joined[0].close()
            raise error
        self._group, self._group_members = joined[0], addresses
        self._open.update(members)

    def _close_group(self) -> None:
        self._group_buffers = []
        group, self._group, self._group_members = self._group, None, ()
        if group is not None:
            group.close()

    def _group_push(
        self, members, plan: BucketPlan, version, fmt, adapter_config, state_dict, stream
    ) -> list[Any]:
        """Broadcast the buckets while every member's UpdateWeightsFromChannel waits for them."""
        start = time.perf_counter()
        try:
            self._ensure_group(members)
        except Exception as error:  # no group: every member gets the stream
            log.warning("weight group did not form (%s); streaming instead", error)
            for address, _ in members:
                self._forget(address)
            return settle([self._stream_call(a, c, stream, version, fmt, adapter_config) for a, c in members])
        group = self._group
        assert group is not None
        with ThreadPoolExecutor(max_workers=len(members)) as pool:
            futures = [
                pool.submit(client.push_from_channel, plan, version, fmt, adapter_config)
                for _, client in members
            ]
            broken: Exception | None = None
            sizes = list(plan.bucket_bytes)
            if [len(b) for b in self._group_buffers] != sizes:
                self._group_buffers = [torch.empty(s, dtype=torch.uint8, device=group.device) for s in sizes]
            try:
                group.broadcast(
                    self._group_buffers, lambda index, bucket: fill_bucket(bucket, plan, index, state_dict)
                )
            except Exception as error:
                broken = error
                self._close_group()  # the members' receives fail instead of waiting
            results: list[Any] = []
            for future in futures:
                try:
                    results.append(future.result())
                except Exception as error:
                    results.append(error)
        outcomes: list[Any] = []
        for (address, client), result in zip(members, results, strict=True):
            if isinstance(result, FALLBACK_ERRORS) or (broken is not None and isinstance(result, Exception)):
                log.warning("distributed push to %s failed (%s); streaming instead", address, result)
                self._forget(address)
                self._close_group()
                outcomes.append(self._stream_call(address, client, stream, version, fmt, adapter_config)())
            elif isinstance(result, Exception):
                outcomes.append(result)
            else:
                outcomes.append(
                    self._timed(address, WeightTransport.TORCH_DISTRIBUTED, plan.total_bytes, start, result)
                )
        return outcomes

    def close(self) -> None:
        """Close the replicas' channels, leave the group and delete the bucket files (the replicas keep
        serving; a replica that does not answer drops its mappings at its next push or stop)."""
        opened, self._open = self._open, {}
        settle([functools.partial(client.close_weight_channel, timeout_s=10) for client in opened.values()])
        self._close_group()
        files, self._files = self._files, {}
        for bucket_files in files.values():
            bucket_files.close()
        self._chosen.clear()


class _LazyPayload:
    """The safetensors encoding for the stream, built (and hashed) once and only when needed."""

    def __init__(self, state_dict: dict[str, torch.Tensor]) -> None:
        self._state_dict = state_dict
        self._payload = None
        self._lock = threading.Lock()

    def get(self):
        with self._lock:
            if self._payload is None:
                payload = encode(self._state_dict)
                payload.sha256  # noqa: B018 - hashed once here, not in each sender thread
                self._payload = payload
            return self._payload
