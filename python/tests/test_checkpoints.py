"""`weightbay.Checkpoints` in every store: the lifecycle, background saves that keep their
moment, incremental saves, damage found by `verify`, saves killed part way never loaded as
complete, and the `weightbay` command reading what Python wrote."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import weightbay


def model(step: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    return {
        "embed": torch.randn(64, 32, generator=generator).to(torch.bfloat16),
        "layer.0.weight": torch.randn(32, 32, generator=generator),
        "step": torch.tensor(step),
    }


def assert_same(loaded: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    assert set(loaded) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(loaded[name], tensor), name


def test_lifecycle_in_every_store(root: str) -> None:
    checkpoints = weightbay.Checkpoints(f"{root}/run")
    assert checkpoints.latest() is None
    assert checkpoints.steps() == []
    for step in (100, 200, 300, 400):
        checkpoints.save(step, model(step), metadata={"loss": str(1 / step)})
    assert checkpoints.steps() == [100, 200, 300, 400]
    assert checkpoints.latest() == 400
    assert_same(checkpoints.load(), model(400))
    assert_same(checkpoints.load(200), model(200))
    with checkpoints.open(300) as container:
        assert container.keys() == sorted(model(300)) or set(container.keys()) == set(model(300))
    assert checkpoints.verify() > 0
    with pytest.raises(FileExistsError):
        checkpoints.save(400, model(1))
    assert checkpoints.retain(keep_last=2, keep_every=200) == [100]
    assert checkpoints.steps() == [200, 300, 400]
    assert checkpoints.gc() == {"orphans": [], "pending": [], "refused": [], "spent": []}
    with pytest.raises(ValueError, match="keep_last"):
        checkpoints.retain()


def test_a_background_save_keeps_the_values_at_the_call(root: str) -> None:
    checkpoints = weightbay.Checkpoints(f"{root}/run")
    weights = {f"w{i}": torch.full((256, 256), float(i)) for i in range(16)}
    expected = {name: tensor.clone() for name, tensor in weights.items()}
    handle = checkpoints.save_in_background(1, weights)
    # Training goes on at once: every tensor changes in place while the save streams.
    for _ in range(20):
        for tensor in weights.values():
            tensor.add_(1.0)
    handle.wait()
    assert handle.done()
    assert handle.step == 1
    assert_same(checkpoints.load(1), expected)
    checkpoints.flush()


def test_incremental_saves_read_as_whole_checkpoints(tmp_path: Path) -> None:
    checkpoints = weightbay.Checkpoints(tmp_path / "run")
    frozen = torch.randn(1024, 1024)  # 4 MiB that never changes
    saved = {}
    for step in range(1, 6):
        tensors = {"embed": frozen, "head": torch.full((256,), float(step))}
        checkpoints.save(step, tensors, incremental=True)
        saved[step] = {name: tensor.clone() for name, tensor in tensors.items()}
    for step, tensors in saved.items():
        assert_same(checkpoints.load(step), tensors)
        assert checkpoints.verify(step) > 0
    on_disk = sum(f.stat().st_size for f in (tmp_path / "run").rglob("*") if f.is_file())
    assert on_disk < 2 * frozen.numel() * 4, f"{on_disk} bytes: the frozen tensor was rewritten"


def test_compressed_saves_store_less_and_load_bit_for_bit(tmp_path: Path) -> None:
    checkpoints = weightbay.Checkpoints(tmp_path / "run")
    generator = torch.Generator().manual_seed(7)
    tensors = {
        "w.bf16": (torch.randn(512, 1024, generator=generator) * 0.02).to(torch.bfloat16),
        "w.f32": torch.randn(256, 1024, generator=generator) * 0.02,
    }
    checkpoints.save(1, tensors, compress=True)
    changed = {**tensors, "w.f32": tensors["w.f32"] + 1}
    checkpoints.save(2, changed, compress=True)
    assert_same(checkpoints.load(1), tensors)
    assert_same(checkpoints.load(2), changed)
    assert checkpoints.verify(1) > 0 and checkpoints.verify(2) > 0
    logical = sum(t.numel() * t.element_size() for t in tensors.values())
    step_1 = tmp_path / "run" / "step-1"
    on_disk = sum(f.stat().st_size for f in step_1.rglob("*") if f.is_file())
    assert on_disk < 0.8 * logical, f"{on_disk} bytes stored for {logical}"


def test_a_changed_container_fails_verify_and_is_not_loaded_silently(tmp_path: Path) -> None:
    checkpoints = weightbay.Checkpoints(tmp_path / "run")
    checkpoints.save(1, model(1))
    container = next(p for p in (tmp_path / "run").rglob("*.bpk"))
    data = bytearray(container.read_bytes())
    data[len(data) // 2] ^= 0xFF
    container.write_bytes(bytes(data))
    with pytest.raises(weightbay.CorruptError) as raised:
        checkpoints.verify(1)
    assert raised.value.key is not None


KILLED_SAVER = textwrap.dedent(
    """
    import sys, torch, weightbay
    checkpoints = weightbay.Checkpoints(sys.argv[1])
    step = int(sys.argv[2])
    tensors = {f"w{i}": torch.full((1024, 1024), float(step)) for i in range(16)}
    print("saving", flush=True)
    checkpoints.save(step, tensors)
    """
)


@pytest.mark.parametrize("delay", [0.0, 0.1, 0.3, 1.0])
def test_a_save_killed_at_any_moment_is_never_loaded_as_complete(root: str, delay: float) -> None:
    prefix = f"{root}/run"
    checkpoints = weightbay.Checkpoints(prefix)
    checkpoints.save(1, {"w0": torch.full((4,), 1.0)})
    saver = subprocess.Popen(
        [sys.executable, "-c", KILLED_SAVER, prefix, "2"], stdout=subprocess.PIPE
    )
    assert saver.stdout is not None
    assert saver.stdout.readline().strip() == b"saving"
    time.sleep(delay)
    saver.send_signal(signal.SIGKILL)
    saver.wait()
    latest = checkpoints.latest()
    # Killed before its commit record: step 1; after it: a whole step 2. Never a torn one.
    assert latest in (1, 2)
    loaded = checkpoints.load()
    assert all(float(t.float().mean()) == float(latest) for t in loaded.values())
    checkpoints.verify()
    checkpoints.save(3, {"w0": torch.full((4,), 3.0)})
    checkpoints.gc()
    assert checkpoints.gc(dry_run=True)["orphans"] == []
    assert checkpoints.steps()[-1] == 3


def test_the_command_reads_what_python_wrote_and_python_reads_its_copies(
    root: str, cli: str
) -> None:
    binary = cli
    prefix = f"{root}/run"
    checkpoints = weightbay.Checkpoints(prefix)
    checkpoints.save(5, model(5))
    listing = subprocess.run([binary, "ls", prefix], check=True, capture_output=True, text=True)
    assert "5" in listing.stdout and "complete" in listing.stdout
    subprocess.run([binary, "verify", prefix], check=True, capture_output=True)
    container = f"{root}/model.bpk"
    weightbay.save(model(6), container)
    copy = f"{root}/copy/model.safetensors"
    subprocess.run([binary, "cp", container, copy], check=True, capture_output=True)
    assert_same(weightbay.load(copy), model(6))
    with weightbay.open(copy) as opened:
        assert opened.format() == "safetensors"
