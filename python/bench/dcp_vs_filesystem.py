"""Paired timing of DCP checkpoints on local disk: `weightbay.torch` against DCP's own
`FileSystemWriter`/`FileSystemReader` and `torch.save` + fsync, each run in a process of its own.

The state dict is a transformer's (bf16 weights and two fp32 Adam moments per weight, a few
hundred tensors) of about `--size-mib`. Every save is durable: DCP's `FileSystemWriter` with its
default `sync_files=True`, `torch.save` followed by `os.fsync` of the file, and weightbay's
commit (fsynced containers, manifests and record). Rows:

- save: the time of `dcp.save` (or `torch.save` + fsync) in a fresh process, the state built
  before the clock starts;
- load: `dcp.load` into a state dict of the same shapes, from the checkpoint that round's save
  of the same system wrote, page cache warm for both;
- blocked: how long `dcp.async_save` (and `weightbay.Checkpoints.save_in_background`) keep the
  caller before training may go on; the save finishes after the clock stops.

A fourth save row is the disk's own limit: the state's bytes written from one buffer and
fsynced. Before each save the machine settles (sync, the page cache dropped when run as root, a
second's pause); the order of the systems rotates every round, so over as many rounds as
systems each runs in every position once. Every run's time is printed, and the ratios are of
medians (peer / weightbay: above 1 means weightbay is faster).

    python python/bench/dcp_vs_filesystem.py --size-mib 2048 --runs 8
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from layouts import LAYER_SHAPES, elements

SAVERS = ["weightbay", "dcp-filesystem", "torch.save", "disk: write + fsync"]
LOADERS = ["weightbay", "dcp-filesystem"]
BACKGROUND = ["weightbay", "dcp-filesystem", "weightbay.Checkpoints"]


def state(size_mib: int) -> dict[str, Any]:
    """A 1024-wide transformer's weights (bf16) and Adam moments (fp32) until `size_mib`."""
    import torch

    weights, optim, total, layer = {}, {}, 0, 0
    while total < size_mib << 20:
        for name, shape in LAYER_SHAPES.items():
            key = f"layers.{layer}.{name}"
            weights[key] = torch.full(shape, float(layer), dtype=torch.bfloat16)
            optim[f"{key}.exp_avg"] = torch.full(shape, 0.5, dtype=torch.float32)
            optim[f"{key}.exp_avg_sq"] = torch.full(shape, 0.25, dtype=torch.float32)
            total += 10 * elements(shape)
        layer += 1
    return {"model": weights, "optim": optim, "step": torch.tensor(layer)}


def state_bytes(sd: dict[str, Any]) -> int:
    return sum(
        t.numel() * t.element_size() for group in ("model", "optim") for t in sd[group].values()
    )


def child(operation: str, system: str, directory: Path, size_mib: int) -> float:
    """Runs one timed operation in this process and returns its seconds."""
    import torch
    import torch.distributed.checkpoint as dcp
    import weightbay
    import weightbay.torch

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    sd = state(size_mib)
    if operation == "load":
        sd = {
            group: {k: torch.empty_like(v) for k, v in items.items()}
            if isinstance(items, dict)
            else torch.empty_like(items)
            for group, items in sd.items()
        }
    start = time.perf_counter()
    if (operation, system) == ("save", "weightbay"):
        dcp.save(sd, storage_writer=weightbay.torch.StorageWriter(directory / "run", 1))
    elif (operation, system) == ("save", "dcp-filesystem"):
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(directory / "dcp"))
    elif (operation, system) == ("save", "torch.save"):
        with open(directory / "model.pt", "wb") as file:
            torch.save(sd, file)
            file.flush()
            os.fsync(file.fileno())
    elif (operation, system) == ("save", "disk: write + fsync"):
        # The disk's limit for this save: the state's bytes from one buffer, then fsync.
        chunk, left = bytes(64 << 20), state_bytes(sd)
        with open(directory / "bytes", "wb") as file:
            while left > 0:
                left -= file.write(chunk[: min(left, len(chunk))])
            file.flush()
            os.fsync(file.fileno())
    elif (operation, system) == ("load", "weightbay"):
        dcp.load(sd, storage_reader=weightbay.torch.StorageReader(directory / "run", 1))
    elif (operation, system) == ("load", "dcp-filesystem"):
        dcp.load(sd, storage_reader=dcp.FileSystemReader(directory / "dcp"))
    elif (operation, system) == ("blocked", "weightbay"):
        writer = weightbay.torch.StorageWriter(directory / "run", 2)
        saving = dcp.async_save(sd, storage_writer=writer)
        blocked = time.perf_counter() - start
        saving.result()
        return blocked
    elif (operation, system) == ("blocked", "dcp-filesystem"):
        saving = dcp.async_save(sd, storage_writer=dcp.FileSystemWriter(directory / "dcp-async"))
        blocked = time.perf_counter() - start
        saving.result()
        return blocked
    elif (operation, system) == ("blocked", "weightbay.Checkpoints"):
        checkpoints = weightbay.Checkpoints(directory / "lifecycle")
        flat = {f"model.{k}": v for k, v in sd["model"].items()}
        flat.update({f"optim.{k}": v for k, v in sd["optim"].items()})
        handle = checkpoints.save_in_background(3, flat)
        blocked = time.perf_counter() - start
        handle.wait()
        return blocked
    else:
        raise ValueError(f"no {operation} for {system}")
    return time.perf_counter() - start


def timed(operation: str, system: str, directory: Path, size_mib: int) -> float:
    out = subprocess.run(
        [sys.executable, __file__, "--child", operation, system, str(directory), str(size_mib)],
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.split()[-1])


def cleared(directory: Path) -> Path:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory


def settled() -> str:
    """Lets the last run's writes and frees finish before the next is timed: sync, the page
    cache dropped where this process may (root), and a second's pause. Says which."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        dropped = "sync, page cache dropped"
    except OSError:
        dropped = "sync only (not root: the page cache is kept)"
    time.sleep(1)
    return dropped


def warmed(directory: Path) -> Path:
    """Reads every file under `directory` once, so a load finds them in the page cache."""
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as file:
                while file.read(64 << 20):
                    pass
    return directory


def rotated(systems: list[str], round: int) -> list[str]:
    """`systems` starting at the round's own: over as many rounds as systems, each runs in
    every position once, so none always meets the others' writeback."""
    first = round % len(systems)
    return systems[first:] + systems[:first]


def row(name: str, times: dict[str, list[float]]) -> None:
    print(f"\n{name}")
    ours = statistics.median(times["weightbay"])
    for system, runs in times.items():
        ratio = statistics.median(runs) / ours
        shown = " ".join(f"{t:.2f}" for t in runs)
        print(f"  {system:24} s: {shown}   median/weightbay's: {ratio:.2f}x")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, operation, system, directory, size_mib = sys.argv
        print(child(operation, system, Path(directory), int(size_mib)))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None, help="where to save (a local disk)")
    parser.add_argument(
        "--only", choices=["save", "load", "blocked"], default=None, help="one row group alone"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(dir=args.dir, prefix="weightbay-dcp-bench-"))
    print(f"{args.size_mib} MiB state dict, {args.runs} rounds, under {base}")
    try:
        saves: dict[str, list[float]] = {s: [] for s in SAVERS}
        loads: dict[str, list[float]] = {s: [] for s in LOADERS}
        blocked: dict[str, list[float]] = {s: [] for s in BACKGROUND}
        for round in range(args.runs):
            for system in rotated(SAVERS, round) if args.only in (None, "save", "load") else []:
                where = cleared(base / system)
                settled()
                saves[system].append(timed("save", system, where, args.size_mib))
            for system in rotated(LOADERS, round) if args.only in (None, "load") else []:
                where = warmed(base / system)
                loads[system].append(timed("load", system, where, args.size_mib))
            for system in rotated(BACKGROUND, round) if args.only in (None, "blocked") else []:
                where = cleared(base / f"background-{system}")
                settled()
                blocked[system].append(timed("blocked", system, where, args.size_mib))
                shutil.rmtree(where)
        print(f"before each save and background save: {settled()}")
        if args.only in (None, "save"):
            row("save, durable (s)", saves)
        if args.only in (None, "load"):
            row("load into the state dict, page cache warm (s)", loads)
        if args.only in (None, "blocked"):
            row("blocked by a background save (s)", blocked)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
