"""Paired timing: `weightbay.load` against `safetensors.torch.load_file` of one safetensors file.

Both map the file and give torch tensors viewing its pages; each run then touches every page of
every tensor, so the time is the load and the page faults, which is what a program that uses
the weights pays. The file (a transformer layout of bf16 weights) is written once and stays in
the page cache; runs alternate between the two, and every run's time is printed.

    python python/bench/load_vs_safetensors.py --size-mib 2048 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import weightbay
from layouts import LAYER_SHAPES, elements

PAGE = 4096


def transformer(size_mib: int) -> dict[str, torch.Tensor]:
    """bf16 layers of a 1024-wide transformer (attention, MLP, norms) until `size_mib`."""
    tensors, total, layer = {}, 0, 0
    while total < size_mib << 20:
        for name, shape in LAYER_SHAPES.items():
            weight = torch.full(shape, float(layer), dtype=torch.bfloat16)
            tensors[f"layers.{layer}.{name}"] = weight
            total += 2 * elements(shape)
        layer += 1
    return tensors


def touched(tensors: dict[str, Any]) -> int:
    """Reads one byte of every page of every tensor."""
    total = 0
    for tensor in tensors.values():
        total += int(tensor.reshape(-1).view(torch.uint8)[::PAGE].sum())
    return total


def timed(load: Callable[[], dict[str, Any]]) -> float:
    start = time.perf_counter()
    touched(load())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.safetensors"
        safetensors.torch.save_file(transformer(args.size_mib), path)
        size = path.stat().st_size
        ours, theirs = [], []
        for _ in range(args.runs + 1):  # the first pair warms the page cache and is dropped
            ours.append(timed(lambda: weightbay.load(path)))
            theirs.append(timed(lambda: safetensors.torch.load_file(path)))
        ours, theirs = ours[1:], theirs[1:]
    print(f"{size / 2**30:.2f} GiB, {args.runs} paired runs, page cache warm")
    print("weightbay.load, s:      ", " ".join(f"{t:.3f}" for t in ours))
    print("safetensors load_file, s:", " ".join(f"{t:.3f}" for t in theirs))
    ratio = statistics.median(theirs) / statistics.median(ours)
    print(f"ratio (theirs / ours, medians): {ratio:.2f}x")


if __name__ == "__main__":
    main()
