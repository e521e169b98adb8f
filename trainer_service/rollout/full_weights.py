"""The policy's full tensors for a weight push, however the trainer holds them (whole, or sharded).

Collective under FSDP and DeepSpeed ZeRO-3: every rank calls :func:`full_state_dict` at the same point, and
only afterwards does the main process send anything. Gathering and sending are never interleaved: were the
main process to send tensor i between the gathers of tensors i and i+1, the other ranks would already wait in
gather i+1 while it blocks on I/O (or in another process group), and a send that fails would leave them
waiting there for good (TRL #7103: ``full_tensor()`` interleaved with rank 0's send hung FSDP2 runs). Here
all gathers finish first, on every rank, in one fixed order; a failure while sending happens on the main
process alone and is shared with the other ranks by
:meth:`~trainer_service.rollout.policy_versions.PolicyVersions.on_main`.

- FSDP2 (``fully_shard``): each parameter is a ``DTensor`` holding this rank's shard; its ``full_tensor()`` is
  one all-gather. :func:`gather_full_tensors` runs them in sorted-name order (identical on every rank: the
  same module tree) for just the tensors to push (the adapter's for a PEFT model, not the frozen base).
- Everything else goes through ``accelerator.get_state_dict``: the model's own tensors on one process or
  under DDP, FSDP1's ``FULL_STATE_DICT`` (rank 0 only) and ZeRO-3's consolidated 16-bit state dict, each one
  collective call made by every rank.

Memory: the main process holds one full copy of what is pushed until the push ends; the other ranks drop each
gathered tensor at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch.distributed.tensor import DTensor

StateDict = dict[str, torch.Tensor]


def _everything(state_dict: StateDict) -> StateDict:
    return state_dict


def full_state_dict(
    accelerator: Any, model: torch.nn.Module, select: Callable[[StateDict], StateDict] = _everything
) -> StateDict:
    """``select(state dict)`` with full tensors on the main process. Collective: call on every rank.

    ``model``: the prepared (wrapped) model. ``select`` picks and names the tensors to push from the model's
    state dict (e.g. ``get_peft_model_state_dict``); it only looks at names, so under FSDP2 it runs on the
    shards and only what it keeps is gathered. Other ranks get ``{}`` under FSDP2, and whatever accelerate
    leaves them otherwise (ranks other than the main one never send).
    """
    if accelerator.is_fsdp2:
        # keep_vars: the parameters themselves, so tied ones (embeddings and LM head) are one object.
        shards = select(model.state_dict(keep_vars=True))
        return gather_full_tensors(shards, keep=accelerator.is_main_process)
    return select(accelerator.get_state_dict(model))


@torch.no_grad()
def gather_full_tensors(tensors: Mapping[str, torch.Tensor], *, keep: bool) -> StateDict:
    """Every ``DTensor`` of ``tensors`` as its full tensor, one all-gather each, in sorted-name order.

    Collective: every rank calls it with the same names (a model's state dict on each rank), and nothing else
    may run between the gathers: they pair up across ranks by order alone. A tensor listed under several
    names (tied weights) is gathered once and shared by those names; plain tensors (buffers, parameters FSDP
    does not shard) are returned detached, as they are. ``keep`` false (the ranks that do not send): each full
    tensor is dropped once gathered and the result is ``{}``.
    """
    # id of each tensor seen → its full tensor (None where not kept): every rank skips the same repeats.
    gathered: dict[int, torch.Tensor | None] = {}
    result: StateDict = {}
    for name in sorted(tensors):
        tensor = tensors[name]
        if id(tensor) not in gathered:
            full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor.detach()
            gathered[id(tensor)] = full if keep else None
        kept = gathered[id(tensor)]
        if kept is not None:
            result[name] = kept
    return result
