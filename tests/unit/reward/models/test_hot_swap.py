"""Hot swap through the registry: leases, versions, unload, and a swap storm under concurrent scoring."""

from __future__ import annotations

import asyncio
import threading

import pytest

from grpo_runtime.errors import InvalidArgument, NotFound
from reward_service.core.types import Message, Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec
from tiny_models.make import make_model

SAMPLES = [
    Sample(
        id=str(i),
        prompt=(Message("user", "Compute 3 * 4 - 5."),),
        completion=f"Step 1: 3 * 4 = 12.\n\nStep 2: 12 - 5 = {i}.",
    )
    for i in range(3)
]


@pytest.fixture(scope="module")
def second_prm(tiny_models, tmp_path_factory):
    """A second token-classification PRM with other weights, so each version's scores are recognisable."""
    return make_model("prm-token", tmp_path_factory.mktemp("prm-token-v2") / "prm-token", seed=1)


def _spec(name, path) -> ModelSpec:
    return ModelSpec(name=name, path=str(path), kind=ModelKind.PRM)


async def _reference(registry: ModelRegistry, name: str) -> list[list[float]]:
    return [r.step_scores for r in await registry.score(f"prm:{name}", SAMPLES, {})]


def _which(results, references) -> int:
    """Index of the reference the results equal (each request must match one model exactly)."""
    scores = [r.step_scores for r in results]
    for index, reference in enumerate(references):
        if all(s == pytest.approx(r, abs=1e-5) for s, r in zip(scores, reference, strict=True)):
            return index
    raise AssertionError(f"scores {scores} match no loaded version")


async def _model_threads(before: set[threading.Thread], at_most: int) -> int:
    """Live threads of models started since ``before`` (a registry's compute thread, its loads, any model's
    own forward thread), once finished loads have exited and retired models have released theirs (≤ 5 s)."""
    for _ in range(100):
        alive = [
            t
            for t in threading.enumerate()
            if t not in before and t.name.startswith(("reward-model", "load-"))
        ]
        if len(alive) <= at_most:
            break
        await asyncio.sleep(0.05)
    return len(alive)


async def test_running_request_finishes_on_the_old_model(tiny_models, second_prm):
    registry = ModelRegistry(ModelSettings(max_wait_ms=400))
    try:
        await registry.load(_spec("ref1", tiny_models["prm-token"]))
        await registry.load(_spec("ref2", second_prm))
        references = [await _reference(registry, "ref1"), await _reference(registry, "ref2")]
        assert references[0] != references[1]

        await registry.load(_spec("p", tiny_models["prm-token"]))
        running = asyncio.create_task(registry.score("prm:p", SAMPLES, {}))
        await asyncio.sleep(0.05)  # the request holds its lease, waiting in the batcher
        info = await registry.load(_spec("p", second_prm))
        assert info.version == 2
        assert _which(await running, references) == 0
        assert _which(await registry.score("prm:p", SAMPLES, {}), references) == 1
        assert [(i.name, i.version) for i in registry.list()] == [("p", 2), ("ref1", 1), ("ref2", 1)]
    finally:
        await registry.close()


async def test_unload_lets_in_flight_requests_finish(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=300))
    try:
        await registry.load(_spec("p", tiny_models["prm-token"]))
        running = asyncio.create_task(registry.score("prm:p", SAMPLES, {}))
        await asyncio.sleep(0.05)
        await registry.unload("p")
        assert not registry.has("prm:p") and registry.list() == [] and registry.describe() == []
        results = await running
        assert all(r.value is not None for r in results)
        with pytest.raises(InvalidArgument):
            await registry.score("prm:p", SAMPLES, {})
        with pytest.raises(NotFound) as absent:
            await registry.unload("p")
        assert absent.value.field == "name"
        # Versions keep counting across an unload.
        assert (await registry.load(_spec("p", tiny_models["prm-token"]))).version == 2
    finally:
        await registry.close()


async def test_failed_load_keeps_the_current_model(tiny_models, tmp_path):
    registry = ModelRegistry(ModelSettings(max_wait_ms=1))
    try:
        await registry.load(_spec("p", tiny_models["prm-token"]))
        before = await registry.score("prm:p", SAMPLES, {})
        with pytest.raises(InvalidArgument):
            await registry.load(_spec("p", tmp_path / "missing"))
        (info,) = registry.list()
        assert info.version == 1 and info.path == str(tiny_models["prm-token"])
        after = await registry.score("prm:p", SAMPLES, {})
        assert [r.step_scores for r in after] == [r.step_scores for r in before]
    finally:
        await registry.close()


async def test_swap_kind_under_one_name(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=1))
    try:
        await registry.load(_spec("m", tiny_models["prm-token"]))
        await registry.load(ModelSpec(name="m", path=str(tiny_models["orm"]), kind=ModelKind.ORM))
        assert registry.has("orm:m") and not registry.has("prm:m")
        (result,) = await registry.score("orm:m", SAMPLES[:1], {})
        assert result.value is not None
    finally:
        await registry.close()


@pytest.mark.slow
async def test_swap_storm_under_concurrent_scoring(tiny_models, second_prm):
    """32 clients score continuously while the model is swapped 6 times: no failure, each result
    comes wholly from one version, and every request started after a swap sees the new version."""
    before = set(threading.enumerate())
    registry = ModelRegistry(ModelSettings(max_wait_ms=5))
    paths = [tiny_models["prm-token"], second_prm]
    try:
        await registry.load(_spec("ref1", paths[0]))
        await registry.load(_spec("ref2", paths[1]))
        references = [await _reference(registry, "ref1"), await _reference(registry, "ref2")]
        await registry.load(_spec("p", paths[0]))
        stop = asyncio.Event()
        seen: list[int] = []
        failures: list[BaseException] = []

        async def client() -> None:
            while not stop.is_set():
                try:
                    seen.append(_which(await registry.score("prm:p", SAMPLES, {}), references))
                except Exception as exc:
                    failures.append(exc)

        clients = [asyncio.create_task(client()) for _ in range(32)]
        for swap in range(1, 7):
            await asyncio.sleep(0.1)
            info = await registry.load(_spec("p", paths[swap % 2]))
            assert info.version == swap + 1
            # A request that starts now must see the version just installed.
            assert _which(await registry.score("prm:p", SAMPLES, {}), references) == swap % 2
        stop.set()
        await asyncio.gather(*clients)
        # Six loads and six retired versions leave one thread behind: the models' compute thread.
        assert await _model_threads(before, at_most=1) == 1
    finally:
        await registry.close()
    assert failures == []
    assert len(seen) > 32 and set(seen) == {0, 1}
