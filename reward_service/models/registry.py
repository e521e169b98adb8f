"""The set of loaded reward models, with atomic hot swap.

Each loaded model is a ``_Slot``: engine + its own dynamic batcher + ``ModelInfo`` + a lease count.
``score`` takes a lease on the slot current when the request starts and keeps it until its results
are back; ``load`` under an existing name builds the new slot off the event loop and then replaces
the dict entry in one step (no await in between), so a request sees either the old or the new
model, never a mix or a gap. A replaced or unloaded slot is retired: it keeps serving its leases and
is closed when the last one is returned.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from grpo_runtime.compute_thread import ComputeThread, run_in_own_thread
from grpo_runtime.errors import InvalidArgument, NotFound
from reward_service.core.types import ComponentResult, RewardDescription, Sample
from reward_service.models.batcher import DynamicBatcher
from reward_service.models.prefix import share_prefixes
from reward_service.models.sequences import Encoded
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import MODEL_NAME_RE, ModelInfo, ModelKind, ModelSpec

if TYPE_CHECKING:
    from reward_service.models.engine import RewardModelEngine

log = logging.getLogger(__name__)

_PREFIXES = {f"{kind.value}:": kind for kind in ModelKind}


def parse_reward_name(reward_name: str) -> tuple[ModelKind, str] | None:
    """``"prm:foo"`` → (PRM, "foo"); None when the name is not a model reward."""
    for prefix, kind in _PREFIXES.items():
        if reward_name.startswith(prefix):
            return kind, reward_name[len(prefix) :]
    return None


@dataclass(eq=False)
class _Slot:
    info: ModelInfo
    engine: RewardModelEngine
    batcher: DynamicBatcher
    leases: int = 0
    retired: bool = False
    disposed: bool = False


class ModelRegistry:
    """Loads, swaps, unloads and scores with PRMs/ORMs/judges (``prm:<name>``, ``orm:<name>``,
    ``judge:<name>``). ``reserved`` reward names (the server's remote judges) cannot be loaded over.

    Every model's forwards run on one compute thread, so the process keeps one OpenMP pool
    (:mod:`grpo_runtime.compute_thread`); loads run on threads that exit."""

    def __init__(self, settings: ModelSettings, reserved: frozenset[str] = frozenset()) -> None:
        self._settings = settings
        self._compute = ComputeThread("reward-models")
        self._reserved = reserved
        self._slots: dict[str, _Slot] = {}
        self._versions: dict[str, int] = {}  # survives unload: versions only grow
        self._load_locks: dict[str, asyncio.Lock] = {}

    async def start(self) -> None:
        """Load ``settings.preload``; an error names the entry (``models.preload[i].<field>``)."""
        for index, entry in enumerate(self._settings.preload):
            try:
                await self.load(entry.to_spec())
            except InvalidArgument as exc:
                where = f"models.preload[{index}]" + (f".{exc.field}" if exc.field else "")
                raise InvalidArgument(exc.message, field=where) from exc

    async def load(self, spec: ModelSpec) -> ModelInfo:
        """Load ``spec`` in a worker thread, then install it under its name, replacing any model there."""
        if not MODEL_NAME_RE.match(spec.name):
            raise InvalidArgument(
                f"{spec.name!r} must be lowercase letters, digits, '-', '_' or '.'", field="name"
            )
        if spec.reward_name in self._reserved:
            raise InvalidArgument(
                f"{spec.reward_name!r} is a remote judge configured on this server", field="name"
            )
        lock = self._load_locks.setdefault(spec.name, asyncio.Lock())
        # torch and transformers load with the first model, not at import: a service that scores only
        # rule rewards starts seconds sooner, and the slim image (no torch) imports this module too.
        from reward_service.models.engine_builder import build_engine, load_model

        async with lock:  # loads of one name install in request order
            # On a thread of its own, not the models' compute thread: the version serving keeps scoring.
            loaded = await run_in_own_thread(load_model, spec, self._settings, name=f"load-{spec.name}")
            engine = await run_in_own_thread(build_engine, loaded, self._settings, name=f"load-{spec.name}")
            version = self._versions.get(spec.name, 0) + 1
            info = ModelInfo(
                name=spec.name,
                path=spec.path,
                kind=spec.kind,
                prm_format=loaded.prm_format,
                version=version,
                device=loaded.device,
                dtype=loaded.dtype,
                loaded_at=datetime.now(UTC),
                max_positions=loaded.max_positions,
            )
            batcher = DynamicBatcher(
                engine.forward,
                max_batch_tokens=self._settings.max_batch_tokens,
                max_wait_ms=self._settings.max_wait_ms,
                dynamic=self._settings.dynamic_batching,
                forward_overhead_tokens=self._settings.forward_overhead_tokens,
                name=spec.name,
                compute=self._compute,
            )
            # The swap: one dict assignment, no await between reading the old slot and replacing it.
            old = self._slots.get(spec.name)
            self._slots[spec.name] = _Slot(info=info, engine=engine, batcher=batcher)
            self._versions[spec.name] = version
        log.info("loaded %s v%d from %s on %s", info.reward_name, version, spec.path, info.device)
        if old is not None:
            await self._retire(old)
        return info

    async def unload(self, name: str) -> None:
        """Remove the model ``name``; requests already scoring with it finish first."""
        slot = self._slots.pop(name, None)
        if slot is None:
            raise NotFound(f"no model named {name!r} is loaded", field="name")
        log.info("unloaded %s v%d", slot.info.reward_name, slot.info.version)
        await self._retire(slot)

    def list(self) -> list[ModelInfo]:
        return [slot.info for _, slot in sorted(self._slots.items())]

    # `list` below names the method above; the builtin is spelled builtins.list in this class from here.
    def describe(self) -> builtins.list[RewardDescription]:
        return [slot.engine.describe(slot.info.reward_name) for _, slot in sorted(self._slots.items())]

    def has(self, reward_name: str) -> bool:
        return self._current(reward_name) is not None

    def batcher_stats(self, name: str) -> dict[str, int]:
        """Counters of the current model's batcher: forward_calls, sequences, largest_batch,
        padded_tokens (B x T of every forward), prefix_tokens (shared prefixes run, padded)."""
        slot = self._slots.get(name)
        if slot is None:
            raise NotFound(f"no model named {name!r} is loaded", field="name")
        batcher = slot.batcher
        return {
            "forward_calls": batcher.forward_calls,
            "sequences": batcher.sequences,
            "largest_batch": batcher.largest_batch,
            "padded_tokens": batcher.padded_tokens,
            "prefix_tokens": slot.engine.prefix_tokens_computed,
        }

    def validate_params(self, reward_name: str, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` with defaults; InvalidArgument naming ``name`` or ``params.<key>``."""
        return self._require(reward_name).engine.validate_params(params)

    async def score(
        self, reward_name: str, samples: Sequence[Sample], params: dict[str, Any]
    ) -> builtins.list[ComponentResult]:
        """One result per sample with the model current when the call starts.

        A sample the model cannot take (no steps, too long) gets an ``error``; the rest are scored.
        """
        slot = self._require(reward_name)
        resolved = slot.engine.validate_params(params)
        slot.leases += 1
        try:
            encoded = await asyncio.to_thread(self._encode_all, slot.engine, samples, resolved)
            ok = [item for item in encoded if isinstance(item, Encoded)]
            outputs = iter(await slot.batcher.submit(ok))
            return [
                slot.engine.finish(next(outputs), resolved)
                if isinstance(item, Encoded)
                else ComponentResult(error=item)
                for item in encoded
            ]
        finally:
            slot.leases -= 1
            if slot.retired and slot.leases == 0:
                await self._dispose(slot)

    async def close(self) -> None:
        slots = list(self._slots.values())
        self._slots.clear()
        for slot in slots:
            slot.retired = True
            await self._dispose(slot)
        await asyncio.to_thread(self._compute.close)

    def _current(self, reward_name: str) -> _Slot | None:
        parsed = parse_reward_name(reward_name)
        if parsed is None:
            return None
        kind, name = parsed
        slot = self._slots.get(name)
        return slot if slot is not None and slot.info.kind is kind else None

    def _require(self, reward_name: str) -> _Slot:
        slot = self._current(reward_name)
        if slot is None:
            raise InvalidArgument(f"no model is loaded as {reward_name!r}", field="name")
        return slot

    def _encode_all(
        self, engine: RewardModelEngine, samples: Sequence[Sample], params: dict[str, Any]
    ) -> builtins.list[Encoded | str]:
        """Each sample's sequence (or why it has none), with shared prefixes marked where allowed."""
        encoded = engine.encode_samples(samples, params)
        if engine.share_prefixes:
            ok = [item for item in encoded if isinstance(item, Encoded)]
            shared = iter(share_prefixes(ok, self._settings.min_shared_prefix_tokens))
            encoded = [next(shared) if isinstance(item, Encoded) else item for item in encoded]
        return encoded

    async def _retire(self, slot: _Slot) -> None:
        slot.retired = True
        if slot.leases == 0:
            await self._dispose(slot)

    async def _dispose(self, slot: _Slot) -> None:
        if slot.disposed:
            return
        slot.disposed = True
        await slot.batcher.close()
        if slot.info.device.startswith("cuda"):
            slot.engine.release_accelerator_memory()
        log.info("released %s v%d", slot.info.reward_name, slot.info.version)
