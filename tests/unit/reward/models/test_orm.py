"""ORM values against TRL 1.16's reward-model branch of ``GRPOTrainer._calculate_rewards``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl.data_utils import apply_chat_template

from reward_service.core.types import Message, Sample
from reward_service.models.registry import ModelRegistry
from reward_service.models.settings import ModelSettings
from reward_service.models.spec import ModelKind, ModelSpec

PROMPTS = [
    [{"role": "user", "content": "What is 12 + 7?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Compute 3 * 4 - 5."}],
    [{"role": "user", "content": "reverse the word hello"}],
]
COMPLETIONS = ["The answer is 19.", "Step 1: 3 * 4 = 12. Step 2: 12 - 5 = 7. The answer is \\boxed{7}.", ""]


def _trl_rewards(path) -> list[float]:
    """TRL's code path, written out: chat template over prompt + completion, right padding, logits[:, 0]."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    messages = [{"messages": p + c} for p, c in zip(PROMPTS, completions, strict=True)]
    texts = [apply_chat_template(x, tokenizer)["text"] for x in messages]
    inputs = tokenizer(
        text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False
    )
    with torch.inference_mode():
        return model(**inputs).logits[:, 0].tolist()


async def test_orm_matches_trl(tiny_models):
    registry = ModelRegistry(ModelSettings(max_wait_ms=1))
    await registry.load(ModelSpec(name="judge", path=str(tiny_models["orm"]), kind=ModelKind.ORM))
    samples = [
        Sample(id=str(i), prompt=tuple(Message(**m) for m in p), completion=c)
        for i, (p, c) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True))
    ]
    try:
        results = await registry.score("orm:judge", samples, {})
        # Scored one at a time (no padding at all) the values are the same.
        alone = [(await registry.score("orm:judge", [s], {}))[0] for s in samples]
    finally:
        await registry.close()
    expected = _trl_rewards(tiny_models["orm"])
    assert [r.value for r in results] == pytest.approx(expected, abs=1e-5)
    assert [r.value for r in alone] == pytest.approx(expected, abs=1e-5)
    assert all(r.error == "" and r.step_scores == [] for r in results)
    assert len({round(v, 6) for v in expected}) == 3  # distinct inputs give distinct rewards


async def test_orm_describes_itself_without_params(tiny_models):
    registry = ModelRegistry(ModelSettings())
    await registry.load(ModelSpec(name="judge", path=str(tiny_models["orm"]), kind=ModelKind.ORM))
    try:
        (description,) = registry.describe()
        assert description.name == "orm:judge" and description.params == ()
        assert description.min_value is None and description.max_value is None
        assert registry.validate_params("orm:judge", {}) == {}
    finally:
        await registry.close()
