"""The state the Python benchmarks save and load: a 1024-wide transformer's layers."""

from __future__ import annotations

HIDDEN = 1024

LAYER_SHAPES: dict[str, tuple[int, ...]] = {
    "attn.qkv.weight": (3 * HIDDEN, HIDDEN),
    "attn.out.weight": (HIDDEN, HIDDEN),
    "mlp.up.weight": (4 * HIDDEN, HIDDEN),
    "mlp.down.weight": (HIDDEN, 4 * HIDDEN),
    "norm.weight": (HIDDEN,),
}
"""One layer's tensors and their shapes; a benchmark repeats layers until its size."""


def elements(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total
