"""gather_full_tensors on two real gloo processes with an FSDP2-sharded model: the main rank gets every full
tensor (tied weights once), the other rank nothing, and the gathers pair up across ranks even when the ranks
list the tensors in different orders."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import fully_shard

from trainer_service.rollout.full_weights import gather_full_tensors

WORLD = 2
DID_NOT_HANG_S = 120.0


class TiedModel(torch.nn.Module):
    """Embedding and LM head share one weight; a buffer FSDP does not shard."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(11, 6)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(6, 6) for _ in range(2))
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.arange(3.0))


def _rank(rank: int, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)  # the same initial weights on every rank, as from_pretrained gives
        model = TiedModel()
        expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        items = list(model.state_dict(keep_vars=True).items())
        if rank == 1:
            items.reverse()  # a rank that lists the names in another order still gathers in the same one
        full = gather_full_tensors(dict(items), keep=rank == 0)
        torch.save(
            {"full": full, "expected": expected, "local_rows": model.embed.weight.to_local().shape[0]},
            Path(out) / f"rank{rank}.pt",
        )
        # A rank tearing gloo down while its peer is still in a collective aborts the peer.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_main_rank_gets_every_full_tensor_other_ranks_nothing(tmp_path):
    context = mp.start_processes(
        _rank, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=WORLD, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + DID_NOT_HANG_S
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"the two ranks did not finish gathering within {DID_NOT_HANG_S:.0f} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    main = torch.load(tmp_path / "rank0.pt")
    other = torch.load(tmp_path / "rank1.pt")
    assert main["local_rows"] < 11  # the embedding really was sharded
    expected = main["expected"]
    assert sorted(main["full"]) == sorted(expected) == sorted(other["expected"])
    for name, tensor in expected.items():
        assert not hasattr(main["full"][name], "to_local"), name  # a plain tensor, not a shard
        torch.testing.assert_close(main["full"][name], tensor, rtol=0, atol=0, msg=name)
    # Tied weights were gathered once and stay one tensor.
    assert main["full"]["head.weight"].data_ptr() == main["full"]["embed.weight"].data_ptr()
    assert other["full"] == {}
