"""The trainer borrows the rollout's cores while no generation runs, switching at leaf-module boundaries."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest
import torch
from torch import nn

from trainer_service.rollout.core_borrowing import CoreBorrowing, leaf_modules


class Probe(torch.autograd.Function):
    """Identity that records torch's thread count on the running thread, forward and backward."""

    @staticmethod
    def forward(ctx, x, record):
        ctx.record = record
        record.append(("forward", torch.get_num_threads()))
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.record.append(("backward", torch.get_num_threads()))
        return grad, None


class ProbeLayer(nn.Module):
    def __init__(self, record: list):
        super().__init__()
        self.record = record

    def forward(self, x):
        return Probe.apply(x, self.record)


class Net(nn.Module):
    def __init__(self, record: list):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(4, 4), ProbeLayer(record)) for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture
def net():
    threads = torch.get_num_threads()
    record: list = []
    yield Net(record), record
    torch.set_num_threads(threads)


def test_leaf_modules_are_the_modules_that_compute(net):
    model, _ = net
    assert [type(m).__name__ for m in leaf_modules(model)] == ["Linear", "ProbeLayer"] * 3


def test_share_while_generating_every_core_once_it_is_done(net):
    model, record = net
    cores = CoreBorrowing(share=1, total=2)
    assert cores.attach(model) == 6
    generation: Future = Future()
    cores.lend(generation)
    model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    assert {threads for _, threads in record} == {1} and cores.borrows == 0

    record.clear()
    out = model(torch.randn(2, 4, requires_grad=True))
    generation.set_result(None)  # the generation ends between the forward and the backward
    out.sum().backward()
    assert [r for r in record if r[0] == "forward"] == [("forward", 1)] * 3
    # Switched before the first module's backward: the whole backward ran on every core.
    assert [r for r in record if r[0] == "backward"] == [("backward", 2)] * 3
    assert cores.borrows == 1

    cores.lend(Future())  # the next prefetch starts: the cores go back at once
    assert torch.get_num_threads() == 1


def test_a_failed_generation_frees_the_cores_too(net):
    model, record = net
    cores = CoreBorrowing(share=1, total=2)
    cores.attach(model)
    generation: Future = Future()
    cores.lend(generation)
    generation.set_exception(RuntimeError("rollout service down"))
    model(torch.randn(2, 4))
    assert record == [("forward", 2)] * 3


def test_no_prefetch_means_idle_and_detach_stops_switching(net):
    model, record = net
    cores = CoreBorrowing(share=1, total=2)
    cores.attach(model)
    cores.lend(Future())
    cores.detach()
    cores.rollout_idle()
    model(torch.randn(2, 4))
    assert record == [("forward", 1)] * 3 and cores.borrows == 0
    cores.attach(model)
    record.clear()
    model(torch.randn(2, 4))
    assert record == [("forward", 2)] * 3


def test_only_the_trainer_thread_switches(net):
    model, record = net
    cores = CoreBorrowing(share=1, total=2)
    cores.attach(model)
    cores.rollout_idle()

    def other() -> None:
        torch.set_num_threads(1)
        model(torch.randn(2, 4))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert record == [("forward", 1)] * 3 and cores.borrows == 0


@pytest.mark.parametrize(("share", "total"), [(0, 2), (3, 2)])
def test_share_must_fit_the_cores(share, total):
    with pytest.raises(ValueError, match="share"):
        CoreBorrowing(share=share, total=total)
