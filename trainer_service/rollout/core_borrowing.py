"""Async rollout on one CPU machine: the trainer borrows the rollout service's cores while they are idle.

While the next batch is generated, trainer and rollout service compute at the same time and split the cores
(:func:`trainer_service.rollout.cpu_placement.overlap_threads`). The generation usually ends before the
trainer's step does (2 cores, 23M policy, 32 completions: generation 1.25 s, loss forward + backward 1.6 s on
one thread each), and from then on the rollout's cores would idle until the next prefetch starts.
:class:`CoreBorrowing` raises the trainer's torch threads to every core as soon as the prefetch's future is
done and lowers them to its share again just before the next prefetch starts, so the two processes never run
more threads than there are cores.

torch sizes each parallel region from the calling thread's setting, so the count can only change between
regions, on the thread that runs them. The switch points are the model's leaf modules (linear layers, norms,
activations): a forward pre-hook, and in backward a hook on the gradient of each leaf's output, which on CPU
the autograd engine runs on the thread that called ``backward()``, the trainer's main thread. A switch
therefore waits at most one layer's forward or backward (a few milliseconds; whole decoder layers as switch
points left up to 90 ms of each step on one thread).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def leaf_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` without children (the ones that run the computation), in order."""
    return [module for module in model.modules() if next(module.children(), None) is None]


class CoreBorrowing:
    """Trainer torch threads: ``share`` while the rollout service generates, ``total`` while it is idle.

    Call :meth:`attach` once with the model (on the trainer's thread), :meth:`lend` with a prefetch's future
    right before it starts generating, :meth:`rollout_idle` when no prefetch was started.
    """

    def __init__(self, share: int, total: int):
        if not 1 <= share <= total:
            raise ValueError(f"need 1 <= share <= total threads, got share {share}, total {total}")
        self.share = share
        self.total = total
        self.borrows = 0  # times the trainer took the rollout's cores
        self._idle = threading.Event()
        self._owner: threading.Thread | None = None  # the trainer's thread, set by attach
        self._handles: list[RemovableHandle] = []

    def attach(self, model: nn.Module) -> int:
        """Put the switch points on ``model``'s leaf modules; returns how many modules were hooked."""
        self._owner = threading.current_thread()
        for module in leaf_modules(model):
            self._handles.append(module.register_forward_pre_hook(self._before_forward))
            self._handles.append(module.register_forward_hook(self._after_forward))
        return len(self._handles) // 2

    def detach(self) -> None:
        """Remove the hooks (the caller restores its thread count)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def lend(self, generation: Future) -> None:
        """The rollout service is about to run ``generation``: give its cores back now, until that future is
        done (with a result or an error)."""
        self._idle.clear()
        torch.set_num_threads(self.share)
        generation.add_done_callback(lambda _: self._idle.set())

    def rollout_idle(self) -> None:
        """No generation is running (none was started): the trainer may use every core."""
        self._idle.set()

    def _switch(self) -> None:
        if (
            self._idle.is_set()
            and threading.current_thread() is self._owner
            and torch.get_num_threads() != self.total
        ):
            torch.set_num_threads(self.total)
            self.borrows += 1

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        self._switch()

    def _after_forward(self, module: nn.Module, args: Any, output: Any) -> None:
        output = output[0] if isinstance(output, tuple) else output
        if isinstance(output, torch.Tensor) and output.requires_grad:
            # Runs when this output's gradient is ready, i.e. just before the module's own backward.
            output.register_hook(self._before_backward)

    def _before_backward(self, grad: torch.Tensor) -> None:
        self._switch()
