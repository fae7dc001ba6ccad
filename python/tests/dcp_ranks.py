"""One rank of a DCP job over gloo on 127.0.0.1, started by `test_torch_dcp.py`.

    python dcp_ranks.py save|load LOCATION STEP RANK WORLD PORT [KILL_AT]

`save` saves the state dict of step STEP, sharded over a device mesh of WORLD ranks, through
`weightbay.torch.StorageWriter`; `load` loads it into a state dict sharded another way (each
rank's shards along dimension 1 at an even world size, to reshard) and exits 1 unless every
byte of its shards is what was saved. KILL_AT (`write`, `written` or `finish`) makes the rank
SIGKILL itself there: before its items are written, once its part is written, or inside the
coordinator's `finish`, before the commit.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import weightbay.torch
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Placement, Shard, distribute_tensor
from torch.futures import Future


def global_state(step: int) -> dict[str, Any]:
    """The whole state of step `step`: bf16 weights, fp32 optimizer moments, a replicated
    step counter, a row count no world size divides evenly, and a non-tensor value."""
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {
            "embed.weight": torch.randn(64, 16, generator=generator).to(torch.bfloat16),
            "layers.0.attn.weight": torch.randn(32, 16, generator=generator).to(torch.bfloat16),
            "layers.0.norm.weight": torch.randn(30, generator=generator),
        },
        "optim": {
            "embed.weight.exp_avg": torch.randn(64, 16, generator=generator),
            "layers.0.attn.weight.exp_avg_sq": torch.rand(32, 16, generator=generator),
            "step": torch.tensor(float(step)),
        },
        "extra": {"epoch": step // 10, "seen": [step, step + 1]},
    }


def sharded(state: dict[str, Any], world: int, dim: int) -> dict[str, Any]:
    """`state` with every tensor of two or more dimensions (and the norm weight, along its
    only one) sharded over a mesh of `world` ranks along `dim`; the rest replicated."""
    mesh = init_device_mesh("cpu", (world,))

    def shard(tensor: torch.Tensor) -> Any:
        if tensor.dim() == 0:
            return tensor
        placements: list[Placement] = [Shard(min(dim, tensor.dim() - 1))]
        return distribute_tensor(tensor, mesh, placements)

    return {
        group: {
            name: shard(value) if isinstance(value, torch.Tensor) else value
            for name, value in items.items()
        }
        if group != "extra"
        else dict(items)
        for group, items in state.items()
    }


class Killing(weightbay.torch.StorageWriter):
    """A writer that SIGKILLs its process at `kill_at`."""

    def __init__(self, location: str, step: int, kill_at: str) -> None:
        super().__init__(location, step)
        self._kill_at = kill_at

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self._kill_at == "write":
            os.kill(os.getpid(), signal.SIGKILL)
        written = super().write_data(plan, planner)
        if self._kill_at == "written":
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self._kill_at == "finish":
            os.kill(os.getpid(), signal.SIGKILL)
        super().finish(metadata, results)


def main() -> int:
    mode, location, step, rank, world, port = sys.argv[1:7]
    kill_at = sys.argv[7] if len(sys.argv) > 7 else ""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=int(rank),
        world_size=int(world),
        timeout=timedelta(seconds=60),
    )
    expected = global_state(int(step))
    if mode == "save":
        state = sharded(expected, int(world), dim=0)
        writer = (
            Killing(location, int(step), kill_at)
            if kill_at
            else weightbay.torch.StorageWriter(location, int(step))
        )
        dcp.save(state, storage_writer=writer)
        dist.destroy_process_group()
        return 0
    dim = 1 if int(world) % 2 == 0 else 0
    state = sharded(
        {
            group: {
                n: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
                for n, v in items.items()
            }
            for group, items in expected.items()
        },
        int(world),
        dim,
    )
    dcp.load(state, storage_reader=weightbay.torch.StorageReader(location, int(step)))
    want = sharded(expected, int(world), dim)
    wrong = []
    for group, items in want.items():
        for name, value in items.items():
            got = state[group][name]
            if isinstance(value, torch.Tensor):
                if not torch.equal(
                    got.to_local() if hasattr(got, "to_local") else got,
                    value.to_local() if hasattr(value, "to_local") else value,
                ):
                    wrong.append(f"{group}.{name}")
            elif got != value:
                wrong.append(f"{group}.{name}: {got!r} != {value!r}")
    dist.destroy_process_group()
    if wrong:
        print(f"rank {rank}: loaded other values for {wrong}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
