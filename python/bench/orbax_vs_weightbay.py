"""Paired timing: `weightbay.Checkpoints` against Orbax's `StandardCheckpointer` (JAX's
checkpointer, over tensorstore), saving and loading the same state on local disk.

The state is a 1024-wide transformer's float32 weights and two Adam moments of each, numpy
arrays built the same way in every process. Each run is a process of its own (Orbax and JAX in
the venv given by ``--orbax-python``, weightbay in this one), the state built before the clock
starts. Before every save the machine settles (``sync``, the page cache dropped where this user
may, a second's pause); loads read that round's checkpoint with the page cache warm and touch
one byte of every page of every array. weightbay's save is durable when it returns (every
file and directory fsynced); Orbax's returns once its files are written, not synced, so a row
of Orbax followed by ``sync`` is beside it. The order of the systems rotates every round, and
every run's time is printed.

    python -m venv /tmp/orbaxvenv && /tmp/orbaxvenv/bin/pip install "jax[cpu]" orbax-checkpoint
    python python/bench/orbax_vs_weightbay.py --size-mib 2048 --runs 5 \\
        --orbax-python /tmp/orbaxvenv/bin/python --dir /var/tmp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from layouts import LAYER_SHAPES, elements

PAGE = 4096
SYSTEMS = ["weightbay", "orbax", "orbax + sync"]


def state(size_mib: int) -> dict[str, Any]:
    """Weights and two moments of each, float32, until ``size_mib``; each array's values its
    own."""
    import numpy as np

    arrays: dict[str, Any] = {}
    total, layer = 0, 0
    while total < size_mib << 20:
        for name, shape in LAYER_SHAPES.items():
            for part, scale in (("weight", 1.0), ("exp_avg", 0.1), ("exp_avg_sq", 0.01)):
                value = np.full(shape, scale * (layer + 1), dtype=np.float32)
                arrays[f"layers.{layer}.{name}.{part}"] = value
                total += 4 * elements(shape)
        layer += 1
    return arrays


def touched(arrays: dict[str, Any]) -> int:
    """Reads one byte of every page of every array."""
    import numpy as np

    total = 0
    for array in arrays.values():
        total += int(np.asarray(array).reshape(-1).view(np.uint8)[::PAGE].sum())
    return total


def child(system: str, action: str, path: Path, size_mib: int) -> float:
    """In a process of its own: one save or load of ``system``; returns its seconds. The
    modules are imported, and JAX's CPU backend started, before the clock starts: a training
    process has them already."""
    if system == "weightbay":
        import weightbay

        checkpoints = weightbay.Checkpoints(str(path), framework="np")
    else:
        import jax
        import orbax.checkpoint as ocp

        jax.devices()
        checkpointer = ocp.StandardCheckpointer()
    if action == "save":
        arrays = state(size_mib)
        start = time.perf_counter()
        if system == "weightbay":
            checkpoints.save(1, arrays)
        else:
            checkpointer.save(path / "state", arrays)
            checkpointer.wait_until_finished()
            if system == "orbax + sync":
                os.sync()
        return time.perf_counter() - start
    start = time.perf_counter()
    if system == "weightbay":
        loaded = checkpoints.load(1)
    else:
        loaded = checkpointer.restore(path / "state")
    touched(loaded)
    return time.perf_counter() - start


def settled() -> None:
    subprocess.run(["sync"], check=True)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        pass
    time.sleep(1)


def run(python: str, system: str, action: str, path: Path, size_mib: int) -> float:
    command = [python, __file__, "--child", system, action, str(path), str(size_mib)]
    answer = subprocess.run(command, capture_output=True, text=True)
    if answer.returncode != 0:
        raise RuntimeError(f"{system} {action} failed: {answer.stderr[-2000:]}")
    return float(json.loads(answer.stdout.splitlines()[-1])["seconds"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the checkpoints go (a real disk)")
    parser.add_argument("--orbax-python", help="a python with jax and orbax (required)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        system, action, path, size = args.child
        print(json.dumps({"seconds": child(system, action, Path(path), int(size))}))
        return
    if args.orbax_python is None:
        parser.error("--orbax-python is required")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for round in range(args.runs):
            order = SYSTEMS[round % len(SYSTEMS) :] + SYSTEMS[: round % len(SYSTEMS)]
            for system in order:
                python = sys.executable if system == "weightbay" else args.orbax_python
                path = Path(directory) / f"{system.replace(' + ', '-')}-{round}"
                path.mkdir()
                settled()
                times.setdefault((system, "save"), []).append(
                    run(python, system, "save", path, args.size_mib)
                )
                if system != "orbax + sync":
                    times.setdefault((system, "load"), []).append(
                        run(python, system, "load", path, args.size_mib)
                    )
                shutil.rmtree(path)
    print(f"{args.size_mib} MiB of float32 state, {args.runs} rounds, each run a process")
    for action in ("save", "load"):
        ours = statistics.median(times[("weightbay", action)])
        for system in SYSTEMS:
            runs = times.get((system, action))
            if runs is None:
                continue
            median = statistics.median(runs)
            shown = " ".join(f"{t:.2f}" for t in runs)
            ratio = median / ours
            print(f"{action} {system:14} {shown}  median {median:.2f}  /weightbay {ratio:.2f}x")


if __name__ == "__main__":
    main()
