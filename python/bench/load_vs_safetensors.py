"""Paired timing: `weightbay.load` against `safetensors.torch.load_file` of one safetensors file,
and against the same load made from Rust.

Both map the file and give torch tensors viewing its pages; each run then touches every page of
every tensor, so the time is the load and the page faults, which is what a program that uses
the weights pays. The file (a transformer layout of bf16 weights) is written once and stays in
the page cache; runs alternate between them, and every run's time is printed.

With `--rust-bench` (the release `weightbay-bench` binary), each round also times the same
load from Rust (`weightbay-bench --load-file`, which maps the file as `weightbay.load` does,
or with `--no-mmap` lands every tensor with `Reader::load_all`, and reads one byte of every
page), timed inside that process: the ratio is what the binding adds.

    python python/bench/load_vs_safetensors.py --size-mib 2048 --runs 5 \
        --rust-bench target/release/weightbay-bench [--no-mmap]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
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


def from_rust(binary: str, path: Path, mmap: bool) -> float:
    """The same load from Rust, timed inside its own process: the third of three runs there.

    This process's loads reuse the memory its earlier ones freed, once glibc's dynamic
    thresholds have risen (its first two rounds fault in every page, the later ones none). A
    fresh process would fault in all of it on each run, and so would the child's later runs
    with glibc's defaults (528k faults a run, about 5x the time, measured): the child keeps
    freed memory too (``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``), so both
    sides pay for the load, not for their allocator's state."""
    command = [binary, "--load-file", str(path), "--runs", "3"]
    if mmap:
        command.append("--mapped")
    keep = {"MALLOC_MMAP_THRESHOLD_": str(4 << 30), "MALLOC_TRIM_THRESHOLD_": str(16 << 30)}
    answer = subprocess.run(
        command, check=True, capture_output=True, text=True, env={**os.environ, **keep}
    )
    return float(answer.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rust-bench", help="the weightbay-bench binary, to pair with Rust")
    parser.add_argument("--no-mmap", action="store_true", help="weightbay.load(mmap=False)")
    args = parser.parse_args()
    mmap = not args.no_mmap
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "model.safetensors"
        safetensors.torch.save_file(transformer(args.size_mib), path)
        size = path.stat().st_size
        ours, theirs, rust = [], [], []
        for _ in range(args.runs + 1):  # the first round warms the page cache and is dropped
            ours.append(timed(lambda: weightbay.load(path, mmap=mmap)))
            theirs.append(timed(lambda: safetensors.torch.load_file(path)))
            if args.rust_bench:
                rust.append(from_rust(args.rust_bench, path, mmap))
        ours, theirs, rust = ours[1:], theirs[1:], rust[1:]
    print(f"{size / 2**30:.2f} GiB, {args.runs} paired runs, page cache warm, mmap={mmap}")
    print("weightbay.load, s:      ", " ".join(f"{t:.3f}" for t in ours))
    print("safetensors load_file, s:", " ".join(f"{t:.3f}" for t in theirs))
    ratio = statistics.median(theirs) / statistics.median(ours)
    print(f"ratio (theirs / ours, medians): {ratio:.2f}x")
    if rust:
        print("the same load from Rust, s:", " ".join(f"{t:.3f}" for t in rust))
        overhead = statistics.median(ours) / statistics.median(rust)
        print(f"Python / Rust (medians): {overhead:.2f}x")


if __name__ == "__main__":
    main()
