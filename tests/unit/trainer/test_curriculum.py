"""Curriculum: pass counts → prime-rl's difficulty pools → sampling weights; TRL's sampler layout kept; the
counts survive a checkpoint; config refusals name the key."""

from __future__ import annotations

from collections import Counter

import pytest
from trl.trainer.utils import RepeatSampler

from trainer_service.config.curriculum import CurriculumConfig
from trainer_service.config.run_config import ConfigError, parse_config
from trainer_service.training.curriculum import Curriculum

PROMPTS = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(10)]


def observed(config: CurriculumConfig | None = None) -> Curriculum:
    """Prompts 0-4 always pass (easy), 5-7 never (hard), 8 half the time (normal), 9 unseen (normal)."""
    curriculum = Curriculum(PROMPTS, config or CurriculumConfig(), "accuracy")
    for i in range(8):
        curriculum.observe([PROMPTS[i]] * 4, [1.0 if i < 5 else 0.0] * 4)
    curriculum.observe([PROMPTS[8]] * 4, [1.0, 0.0, None, 1.0])
    return curriculum


def test_pools_and_weights_follow_pass_rates():
    curriculum = observed()
    assert [curriculum.pool(key) for key in curriculum.keys] == ["easy"] * 5 + ["hard"] * 3 + ["normal"] * 2
    assert curriculum.weights() == [0.2] * 5 + [0.2] * 3 + [1.0] * 2
    assert curriculum.metrics() == {"curriculum/easy": 5.0, "curriculum/normal": 2.0, "curriculum/hard": 3.0}
    # Looser pools: 8's pass rate 0.5 is easy at easy_pass_rate 0.5.
    loose = observed(CurriculumConfig(easy_pass_rate=0.5, hard_pass_rate=0.1, hard_weight=3.0))
    assert loose.pool(loose.keys[8]) == "easy" and loose.weights()[5] == 3.0


def repeat_sampler(batch_size: int, seed: int = 0) -> RepeatSampler:
    return RepeatSampler(
        PROMPTS, mini_repeat_count=3, batch_size=batch_size, repeat_count=2, shuffle=True, seed=seed
    )


def test_sampler_keeps_trls_layout():
    curriculum = observed()
    inner = repeat_sampler(batch_size=2)
    indices = list(curriculum.wrap(inner))
    assert len(indices) == len(inner) == len(list(inner))
    # Chunks of 2 distinct prompts, each prompt 3 times in a row, each chunk twice.
    for start in range(0, len(indices), 12):
        chunk = indices[start : start + 12]
        assert chunk[:6] == chunk[6:] and chunk[:3] == [chunk[0]] * 3 and chunk[3:6] == [chunk[3]] * 3
        assert chunk[0] != chunk[3]


def test_sampling_follows_the_weights_seeded():
    """One prompt per chunk: each draw picks row i with probability weight_i / Σ weights. Normal rows weigh
    2 × 1.0 of 3.6 (0.556), easy 5 × 0.2 (0.278), hard 3 × 0.2 (0.167); 20 000 draws put each share within
    a few tenths of a percent (σ ≈ 0.0035) of it."""
    curriculum = observed()
    sampler = curriculum.wrap(repeat_sampler(batch_size=1, seed=1))
    pools = Counter()
    for _ in range(2000):
        for index in list(sampler)[::6]:  # one entry per chunk (3 repeats × 2)
            pools[curriculum.pool(curriculum.keys[index])] += 1
    total = sum(pools.values())
    assert total == 20_000
    assert pools["normal"] / total == pytest.approx(2 / 3.6, abs=0.02)
    assert pools["easy"] / total == pytest.approx(1 / 3.6, abs=0.02)
    assert pools["hard"] / total == pytest.approx(0.6 / 3.6, abs=0.02)
    # Seeded like TRL's sampler: the same seed, the same draws.
    first, again = (list(curriculum.wrap(repeat_sampler(batch_size=1, seed=5))) for _ in range(2))
    assert first == again


def test_counts_survive_a_checkpoint(tmp_path):
    curriculum = observed()
    curriculum.save(tmp_path)
    restored = Curriculum(PROMPTS, CurriculumConfig(), "accuracy")
    assert restored.load(tmp_path) and restored.weights() == curriculum.weights()
    assert restored.state_dict() == curriculum.state_dict()
    assert not Curriculum(PROMPTS, CurriculumConfig(), "accuracy").load(tmp_path / "missing")


BASE = {"base": "m", "data": {"train": "t"}}


@pytest.mark.parametrize(
    ("curriculum", "key", "fragment"),
    [
        (
            {"easy_pass_rate": 0.3, "hard_pass_rate": 0.5},
            "training.sampling.curriculum",
            "hard_pass_rate must be below",
        ),
        ({"easy_weight": 0}, "training.sampling.curriculum.easy_weight", "greater than 0"),
        ({"pools": 3}, "training.sampling.curriculum.pools", "unknown key"),
    ],
)
def test_curriculum_config_refusals_name_the_key(curriculum, key, fragment):
    with pytest.raises(ConfigError) as caught:
        parse_config({**BASE, "training": {"sampling": {"curriculum": curriculum}}})
    assert caught.value.key == key and fragment in str(caught.value)
