"""FSDP2 on CPU processes (gloo), which accelerate leaves out.

accelerate turns its FSDP plugin on only for GPU-like distributed types: a multi-process CPU run
(``MULTI_CPU``, gloo) with ``training.model.fsdp_config`` would silently train with DDP, every rank holding
the whole model. torch's FSDP2 (``fully_shard``) runs on CPU over gloo, so :class:`CpuFsdpMixin` marks such a
run FSDP right after the accelerator is created and before the model is prepared; accelerate then shards the
model as it would on GPUs (``fsdp2_prepare_model``) and the trainer takes its FSDP paths (state dict,
checkpoints). accelerate's FSDP1 plugin refuses to start without an accelerator ("no available devices"),
so ``fsdp_config.version: 1`` on CPU is refused up front, naming the key.
"""

from __future__ import annotations

from accelerate import PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from grpo_runtime.config import ConfigError
from trainer_service.training.trainer_host import GRPOTrainerHost


class CpuFsdpMixin(GRPOTrainerHost):
    """A ``transformers.Trainer`` mixin: a multi-process CPU run with FSDP arguments trains with FSDP2."""

    def create_accelerator_and_postprocess(self) -> None:
        plugin_args = self.args.fsdp_plugin_args
        if plugin_args is not None and self.args.use_cpu and plugin_args.get("fsdp_version") != 2:
            # accelerate's FSDP1 plugin would fail with "no available devices found".
            raise ConfigError("FSDP on CPU needs FSDP2 (version: 2)", key="training.model.fsdp_config")
        super().create_accelerator_and_postprocess()
        if plugin_args is None or self.accelerator.distributed_type is not DistributedType.MULTI_CPU:
            return
        plugin = FullyShardedDataParallelPlugin(**plugin_args)
        state = self.accelerator.state
        if state.mixed_precision != "no":
            plugin.set_mixed_precision(state.mixed_precision)
        # What accelerate's AcceleratorState does for a GPU run with a plugin. PartialState too: every later
        # AcceleratorState() copies its distributed type (both count as torch.distributed for collectives).
        PartialState().distributed_type = DistributedType.FSDP
        state.distributed_type = DistributedType.FSDP
        state.fsdp_plugin = plugin
        self.is_fsdp_enabled = True
