"""Sleep / wake state machine shared by every engine.

- ``sleep(1)``: the engine offloads its weights (to host memory) and frees caches; the weights
  survive and generation works again after waking.
- ``sleep(2)``: the engine discards weights and caches. After waking, the weights are not valid
  (vLLM's level-2 weights are garbage until reloaded) until a weight update or load arrives, so
  Generate is refused with FAILED_PRECONDITION until then.
- ``wake_up(tags)``: ``"weights"`` and/or ``"kv_cache"``; empty = both. Waking the weights alone
  allows a weight push before the KV cache is reallocated (the RLHF pattern that avoids OOM).

Generate needs: awake (no tag asleep) and valid weights. A weight update needs the weights awake.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_runtime.errors import FailedPrecondition, InvalidArgument

TAGS = ("weights", "kv_cache")


@dataclass
class SleepState:
    level: int = 0
    sleeping_tags: set[str] = field(default_factory=set)
    weights_valid: bool = True

    def check_sleep(self, level: int) -> bool:
        """Validate a Sleep; returns False when already asleep at that level or deeper (no-op)."""
        if level not in (1, 2):
            raise InvalidArgument(f"must be 1 or 2, got {level}", field="level")
        if self.level >= level:
            return False
        if self.level:
            raise FailedPrecondition(f"already asleep at level {self.level}; wake up before sleeping deeper")
        return True

    def enter(self, level: int) -> None:
        self.level = level
        self.sleeping_tags = set(TAGS)
        if level == 2:
            self.weights_valid = False

    @staticmethod
    def parse_tags(tags: list[str] | tuple[str, ...]) -> set[str]:
        for i, tag in enumerate(tags):
            if tag not in TAGS:
                raise InvalidArgument(f"unknown tag {tag!r}; use 'weights' or 'kv_cache'", field=f"tags[{i}]")
        return set(tags) if tags else set(TAGS)

    def wake(self, tags: set[str]) -> None:
        self.sleeping_tags -= tags
        if not self.sleeping_tags:
            self.level = 0

    def check_generate(self) -> None:
        if self.sleeping_tags:
            asleep = ", ".join(sorted(self.sleeping_tags))
            raise FailedPrecondition(
                f"the engine is asleep (level {self.level}, asleep: {asleep}); call WakeUp first"
            )
        if not self.weights_valid:
            raise FailedPrecondition(
                "the weights were discarded by a level-2 sleep; push or load weights before generating"
            )

    def check_weight_update(self) -> None:
        if "weights" in self.sleeping_tags:
            raise FailedPrecondition(
                "the weights are asleep; call WakeUp(tags=['weights']) before updating them"
            )

    def weights_loaded(self) -> None:
        self.weights_valid = True
