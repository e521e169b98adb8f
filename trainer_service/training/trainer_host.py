"""What the trainer mixins use of the `trl.GRPOTrainer` they are mixed into, declared for the type checker.

`VariantLossMixin`, `DynamicSamplingMixin`, `CpuFsdpMixin` and `ModelCardMixin` are bases of classes built
with a `trl.GRPOTrainer` (`make_variant_trainer`, `with_model_card`): they read the trainer's attributes and
extend its methods through ``super()``. Each mixin derives from `GRPOTrainerHost`, which declares those
attributes and methods with the types they hold once the trainer is constructed (TRL infers some of them
looser: ``args`` as ``TrainingArguments``, ``model`` as optional). At run time `GRPOTrainerHost` is
``object``, so it adds nothing to a trainer class or its MRO.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections import defaultdict

    import torch
    from accelerate import Accelerator
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase, ProcessorMixin, TrainerState
    from trl import GRPOConfig
    from trl.trainer.grpo_trainer import RolloutFunc

    class GRPOTrainerHost:
        """The `trl.GRPOTrainer` (TRL 1.16) attributes and methods the mixins use."""

        # transformers.Trainer
        args: GRPOConfig
        accelerator: Accelerator
        model: torch.nn.Module
        processing_class: PreTrainedTokenizerBase | ProcessorMixin
        train_dataset: Dataset
        state: TrainerState
        current_gradient_accumulation_steps: int

        def is_world_process_zero(self) -> bool: ...

        def create_accelerator_and_postprocess(self) -> None: ...

        # GRPOTrainer: generation (GRPOConfig.__post_init__ requires num_generations; the trainer sets
        # num_generations_eval to it when the config leaves it unset)
        num_generations: int
        num_generations_eval: int
        max_completion_length: int | None
        rollout_func: RolloutFunc | None
        use_vllm: bool
        vllm_importance_sampling_correction: bool
        vllm_importance_sampling_mode: str
        vllm_importance_sampling_clip_min: float | None
        vllm_importance_sampling_clip_max: float | None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]: ...

        # GRPOTrainer: the loss
        beta: float
        epsilon_low: float
        epsilon_high: float
        off_policy_mask_threshold: float | None
        top_entropy_quantile: float
        aux_loss_enabled: bool
        router_aux_loss_coef: float
        # Entropy bonus; the adaptive controller's window sums (entropy·mask, mask) until the optimizer step.
        entropy_coef: float
        use_adaptive_entropy: bool
        _entropy_bonus_enabled: bool
        _last_world_entropy: float
        _entropy_window_stats: torch.Tensor | None
        # Logged metrics: mode ("train" / "eval") → name → values since the last log.
        _metrics: dict[str, defaultdict[str, list[float]]]

        def _get_per_token_logps_and_entropies(
            self,
            model: torch.nn.Module,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            logits_to_keep: int,
            batch_size: int | None = None,
            compute_entropy: bool = False,
            compute_aux_loss: bool = False,
            **forward_inputs: Any,
        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]: ...

        def get_high_entropy_mask(
            self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
        ) -> torch.Tensor: ...

else:
    GRPOTrainerHost = object
