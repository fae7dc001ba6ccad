"""`weightbay.torch`, the storage plugin for PyTorch Distributed Checkpoint, with the real DCP:
round trips in every store, four gloo ranks on 127.0.0.1 saving a sharded state that loads at
world sizes 4, 2 and 1, ranks killed part way through a save, background saves, the
`weightbay` command on what DCP wrote, and bad input refused."""

from __future__ import annotations

import os
import pickle
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import weightbay
import weightbay.torch
from torch.distributed.checkpoint.api import CheckpointException

# DCP reports a rank's failure as a `CheckpointException` (a `BaseException`) carrying the
# rank's traceback, and a failed metadata read as an `AssertionError` quoting it.
DCP_FAILURES = (CheckpointException, AssertionError)

RANKS = Path(__file__).with_name("dcp_ranks.py")
sys.path.insert(0, str(RANKS.parent))

from dcp_ranks import global_state  # noqa: E402

# DCP warns that it saves in one process when no process group is set up: that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def every_dtype() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    floats = torch.randn(5, 3, generator=generator)
    return {
        "f64": floats.double(),
        "f32": floats,
        "f16": floats.half(),
        "bf16": floats.bfloat16(),
        "f8_e4m3": floats.to(torch.float8_e4m3fn),
        "f8_e5m2": floats.to(torch.float8_e5m2),
        "i64": torch.arange(-7, 8).reshape(3, 5),
        "i32": torch.arange(6, dtype=torch.int32),
        "i16": torch.arange(6, dtype=torch.int16),
        "i8": torch.arange(-3, 3, dtype=torch.int8),
        "u8": torch.arange(6, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 4),
        "strided": floats.t(),
    }


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def zeros_like(state: dict[str, Any]) -> dict[str, Any]:
    return {
        name: zeros_like(value)
        if isinstance(value, dict)
        else torch.zeros_like(value)
        if isinstance(value, torch.Tensor)
        else None
        for name, value in state.items()
    }


def test_a_state_dict_round_trips_in_every_store(root: str) -> None:
    state: dict[str, Any] = {"model": every_dtype(), "epoch": 3, "config": {"lr": 0.1}}
    dcp.save(state, storage_writer=weightbay.torch.StorageWriter(f"{root}/run", step=10))
    assert weightbay.Checkpoints(f"{root}/run").steps() == [10]
    loaded = zeros_like(state)
    dcp.load(loaded, storage_reader=weightbay.torch.StorageReader(f"{root}/run"))
    for name, tensor in state["model"].items():
        assert same_bits(loaded["model"][name], tensor), name
    assert loaded["epoch"] == 3
    assert loaded["config"] == {"lr": 0.1}


def test_a_checkpoint_id_names_the_step(tmp_path: Path) -> None:
    state = {"w": torch.arange(12.0).reshape(3, 4)}
    writer = weightbay.torch.StorageWriter()
    dcp.save(state, checkpoint_id=tmp_path / "run" / "step-3", storage_writer=writer)
    loaded = {"w": torch.zeros(3, 4)}
    reader = weightbay.torch.StorageReader()
    dcp.load(loaded, checkpoint_id=f"{tmp_path}/run/step-3", storage_reader=reader)
    assert torch.equal(loaded["w"], state["w"])
    assert weightbay.torch.StorageWriter.validate_checkpoint_id("s3://b/run/step-3")
    assert not weightbay.torch.StorageWriter.validate_checkpoint_id("s3://b/run")


def test_the_reader_loads_the_newest_complete_step_or_the_one_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (1, 2):
        dcp.save(
            {"w": torch.full((4,), float(step))},
            storage_writer=weightbay.torch.StorageWriter(run, step),
        )
    newest = {"w": torch.zeros(4)}
    dcp.load(newest, storage_reader=weightbay.torch.StorageReader(run))
    assert newest["w"].tolist() == [2.0] * 4
    first = {"w": torch.zeros(4)}
    dcp.load(first, storage_reader=weightbay.torch.StorageReader(run, step=1))
    assert first["w"].tolist() == [1.0] * 4


def test_targets_of_another_dtype_or_layout_load_converted(tmp_path: Path) -> None:
    state = {"w": torch.arange(12.0, dtype=torch.bfloat16).reshape(3, 4), "v": torch.arange(6.0)}
    dcp.save(state, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run", 1))
    # `w` into float32 (copy_ converts, as DCP's own reader does); `v` into a strided view.
    backing = torch.zeros(12)
    loaded = {"w": torch.zeros(3, 4), "v": backing[::2]}
    dcp.load(loaded, storage_reader=weightbay.torch.StorageReader(tmp_path / "run"))
    assert torch.equal(loaded["w"], state["w"].float())
    assert backing[::2].tolist() == state["v"].tolist()
    assert backing[1::2].tolist() == [0.0] * 6


def test_a_read_in_place_refuses_targets_that_share_memory_or_dtype_mismatches(
    tmp_path: Path,
) -> None:
    state = {"w": torch.arange(8.0)}
    dcp.save(state, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run", 1))
    assembled = weightbay._native.Checkpoints(str(tmp_path / "run")).assembled()
    shared = torch.zeros(8)
    with pytest.raises(ValueError, match="share memory"):
        assembled.read_regions_into([("w", [0], [4], shared[:4]), ("w", [2], [4], shared[2:6])])
    with pytest.raises(ValueError, match="stored as F32, the target is F64"):
        assembled.read_regions_into([("w", [0], [8], torch.zeros(8, dtype=torch.float64))])
    with pytest.raises(ValueError, match="does not hold"):
        assembled.read_regions_into([("w", [0], [8], torch.zeros(7))])
    assert shared.tolist() == [0.0] * 8
    apart = torch.zeros(8)
    assembled.read_regions_into([("w", [0], [4], apart[:4]), ("w", [4], [4], apart[4:])])
    assert torch.equal(apart, state["w"])


def test_a_checkpoint_filesystem_writer_wrote_loads_and_moves_to_a_run(tmp_path: Path) -> None:
    state: dict[str, Any] = {"model": every_dtype(), "epoch": 3, "config": {"lr": 0.1}}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "dcp"))
    for reader, checkpoint_id in [
        (weightbay.torch.StorageReader(tmp_path / "dcp"), None),
        (weightbay.torch.StorageReader(), tmp_path / "dcp"),
    ]:
        loaded = zeros_like(state)
        dcp.load(loaded, checkpoint_id=checkpoint_id, storage_reader=reader)
        for name, tensor in state["model"].items():
            assert same_bits(loaded["model"][name], tensor), name
        assert loaded["epoch"] == 3
        assert loaded["config"] == {"lr": 0.1}
    # Moved over: loaded from the old directory, saved as a step of a run.
    dcp.save(loaded, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run", 1))
    assert weightbay.Checkpoints(tmp_path / "run").steps() == [1]


class _Planted:
    """A pickle that runs a command when loaded, as a planted ``.metadata`` would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_filesystem_metadata_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    state = {"w": torch.arange(4.0)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp_path / "dcp"))
    metadata = tmp_path / "dcp" / ".metadata"
    original = metadata.read_bytes()

    def load() -> None:
        reader = weightbay.torch.StorageReader(metadata.parent)
        dcp.load({"w": torch.zeros(4)}, storage_reader=reader)

    marker = tmp_path / "ran"
    metadata.write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.raises(DCP_FAILURES, match=r"names \w+\.system, which DCP's metadata"):
        load()
    assert not marker.exists()
    # An item whose file lies outside the directory: refused, naming the item.
    escaped = pickle.loads(original)
    for info in escaped.storage_data.values():
        info.relative_path = "../outside.distcp"
    metadata.write_bytes(pickle.dumps(escaped))
    with pytest.raises(DCP_FAILURES, match=re.escape("item 'w' names the file '../outside")):
        load()
    metadata.write_bytes(b"\x80\x05not a pickle")
    with pytest.raises(DCP_FAILURES, match="not DCP's metadata"):
        load()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ranks(
    mode: str, location: str, step: int, world: int, kill: dict[int, str] | None = None
) -> list[subprocess.Popen[bytes]]:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return [
        subprocess.Popen(
            [
                sys.executable,
                str(RANKS),
                mode,
                location,
                str(step),
                str(rank),
                str(world),
                str(port),
                *([kill[rank]] if kill and rank in kill else []),
            ],
            env=env,
            stderr=subprocess.PIPE,
        )
        for rank in range(world)
    ]


def finished(processes: list[subprocess.Popen[bytes]], timeout: float = 240) -> list[int]:
    codes = []
    for process in processes:
        try:
            _, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
        if process.returncode != 0:
            sys.stderr.write(err.decode(errors="replace")[-3000:])
        codes.append(process.returncode)
    return codes


def load_whole(location: str, step: int) -> dict[str, Any]:
    state = zeros_like(global_state(step))
    dcp.load(state, storage_reader=weightbay.torch.StorageReader(location, step))
    return state


@pytest.mark.parametrize("store", ["local", "s3"])
def test_four_ranks_save_a_sharded_state_that_loads_at_four_two_and_one(
    store: str, tmp_path: Path
) -> None:
    from conftest import store_root

    location = f"{store_root(store, tmp_path)}/run"
    assert finished(ranks("save", location, 40, 4)) == [0] * 4
    assert weightbay.Checkpoints(location).steps() == [40]
    assert finished(ranks("load", location, 40, 4)) == [0] * 4
    assert finished(ranks("load", location, 40, 2)) == [0] * 2
    loaded = load_whole(location, 40)
    expected = global_state(40)
    for group in ("model", "optim"):
        for name, tensor in expected[group].items():
            assert same_bits(loaded[group][name], tensor), f"{group}.{name}"
    assert loaded["extra"] == expected["extra"]
    assert weightbay.Checkpoints(location).verify(40) > 0


@pytest.mark.parametrize("kill_at", ["write", "written", "finish"])
def test_a_rank_killed_during_a_save_leaves_no_checkpoint_and_the_rerun_commits(
    kill_at: str, tmp_path: Path
) -> None:
    location = str(tmp_path / "run")
    victim = 0 if kill_at == "finish" else 1
    processes = ranks("save", location, 50, 2, kill={victim: kill_at})
    processes[victim].wait(timeout=240)
    assert processes[victim].returncode == -9
    # The survivor waits in a collective for the dead rank; the launcher ends it.
    time.sleep(0.5)
    for process in processes:
        process.kill()
    finished(processes)
    checkpoints = weightbay.Checkpoints(location)
    assert checkpoints.steps() == []
    with pytest.raises(DCP_FAILURES, match="not found"):
        load_whole(location, 50)
    assert finished(ranks("save", location, 50, 2)) == [0, 0]
    assert checkpoints.steps() == [50]
    loaded = load_whole(location, 50)
    assert same_bits(loaded["model"]["embed.weight"], global_state(50)["model"]["embed.weight"])
    checkpoints.gc()
    assert checkpoints.gc(dry_run=True) == {
        "orphans": [],
        "spent": [],
        "pending": [],
        "refused": [],
    }
    committed = commit_record_keys(tmp_path / "run" / "step-50")
    stored = {
        str(path.relative_to(tmp_path / "run" / "step-50"))
        for path in (tmp_path / "run" / "step-50").rglob("*.safetensors")
    }
    assert stored == committed


def commit_record_keys(step_dir: Path) -> set[str]:
    import json

    record = json.loads((step_dir / "commit.json").read_text())
    return {container["key"] for container in record["containers"]}


def test_an_async_save_keeps_the_values_at_the_call(tmp_path: Path) -> None:
    state = {"w": torch.arange(1 << 16, dtype=torch.float32)}
    expected = state["w"].clone()
    saving = dcp.async_save(
        state, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run", 1)
    )
    state["w"].add_(1.0)
    saving.result()
    loaded = {"w": torch.zeros(1 << 16)}
    dcp.load(loaded, storage_reader=weightbay.torch.StorageReader(tmp_path / "run", 1))
    assert torch.equal(loaded["w"], expected)


def test_the_command_lists_and_verifies_what_dcp_wrote(tmp_path: Path, cli: str) -> None:
    run = tmp_path / "run"
    dcp.save(global_state(5), storage_writer=weightbay.torch.StorageWriter(run, 5))
    listed = subprocess.run([cli, "ls", str(run)], capture_output=True, text=True, check=True)
    assert "5" in listed.stdout and "complete" in listed.stdout, listed.stdout
    subprocess.run([cli, "verify", str(run)], check=True, capture_output=True)
    copy = tmp_path / "copy"
    subprocess.run([cli, "cp", str(run), str(copy), "--step", "5"], check=True, capture_output=True)
    loaded = load_whole(str(copy), 5)
    assert same_bits(
        loaded["optim"]["embed.weight.exp_avg"], global_state(5)["optim"]["embed.weight.exp_avg"]
    )


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (torch.zeros(2, dtype=torch.complex64), "ValueError: tensor `bad`: complex64"),
        (torch.zeros(2, device="meta"), "ValueError: tensor 'bad' is on meta"),
        (torch.zeros(4).to_sparse(), "TypeError: tensor 'bad' is torch.sparse_coo"),
    ],
)
def test_a_tensor_with_no_stored_form_is_refused_and_nothing_is_written(
    value: torch.Tensor, why: str, tmp_path: Path
) -> None:
    state = {"fine": torch.ones(3), "bad": value}
    with pytest.raises(DCP_FAILURES, match=re.escape(why)):
        dcp.save(state, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run", 1))
    assert weightbay.Checkpoints(tmp_path / "run").steps() == []
    assert not list(tmp_path.rglob("*.safetensors"))


def test_a_writer_without_a_step_says_so(tmp_path: Path) -> None:
    with pytest.raises(DCP_FAILURES, match="needs a step"):
        dcp.save(
            {"w": torch.ones(2)}, storage_writer=weightbay.torch.StorageWriter(tmp_path / "run")
        )


def test_a_checkpoint_not_written_by_ranks_is_refused_naming_why(tmp_path: Path) -> None:
    weightbay.Checkpoints(tmp_path / "run").save(1, {"w": torch.ones(2)})
    with pytest.raises(
        DCP_FAILURES, match="invalid input: this checkpoint was written by one process"
    ):
        dcp.load(
            {"w": torch.zeros(2)}, storage_reader=weightbay.torch.StorageReader(tmp_path / "run")
        )


def test_a_missing_run_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(DCP_FAILURES, match="not found: no complete checkpoint under this prefix"):
        dcp.load(
            {"w": torch.zeros(2)}, storage_reader=weightbay.torch.StorageReader(tmp_path / "none")
        )
