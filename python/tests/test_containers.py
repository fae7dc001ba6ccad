"""`save`, `load` and `open` of one container: every dtype and shape, every store, metadata,
zero-copy loads, bad input refused before anything is written, and errors that name what
failed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
import weightbay
from weightbay import _native

TORCH_DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint64,
    torch.uint32,
    torch.uint16,
    torch.uint8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
FLOAT8 = {torch.float8_e4m3fn, torch.float8_e5m2}
SHAPES = [(), (0,), (0, 3), (7,), (3, 5), (2, 3, 4)]


def sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values that use every bit pattern the dtype's bytes can hold, so a byte out of place
    shows."""
    generator = torch.Generator().manual_seed(seed)
    count = int(np.prod(shape)) if shape else 1
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (count * itemsize,), dtype=torch.uint8, generator=generator)
    if dtype == torch.bool:
        return (raw[:count] % 2 == 1).reshape(shape)
    return raw.view(dtype).reshape(shape)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (NaNs included)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def every_dtype(with_float8: bool) -> dict[str, torch.Tensor]:
    tensors = {}
    for index, dtype in enumerate(TORCH_DTYPES):
        if dtype in FLOAT8 and not with_float8:
            continue
        for shape in SHAPES:
            name = f"{str(dtype).removeprefix('torch.')}.{'x'.join(map(str, shape)) or 'scalar'}"
            tensors[name] = sample(dtype, shape, seed=index)
    return tensors


@pytest.mark.parametrize("format", ["safetensors", "bpk"])
def test_every_dtype_and_shape_round_trips_in_every_store(root: str, format: str) -> None:
    # Burnpack has no float8 spelling; safetensors does.
    tensors = every_dtype(with_float8=format == "safetensors")
    location = f"{root}/model.{format}"
    weightbay.save(tensors, location, metadata={"run": "7", "note": "ü"})
    for mmap in (True, False):
        loaded = weightbay.load(location, mmap=mmap)
        assert list(loaded) == sorted(tensors) or set(loaded) == set(tensors)
        for name, tensor in tensors.items():
            assert same(loaded[name], tensor), name
    with weightbay.open(location) as container:
        assert container.metadata()["run"] == "7"
        assert container.metadata()["note"] == "ü"
        assert container.format() == ("safetensors" if format == "safetensors" else "burnpack")
        assert container.verify() > 0
        name = "bfloat16.2x3x4"
        assert container.info(name) == ("BF16", [2, 3, 4])
        assert same(container.get_tensor(name), tensors[name])


def test_numpy_arrays_of_every_numpy_dtype_round_trip(tmp_path: Path) -> None:
    arrays: dict[str, Any] = {
        str(dtype): np.arange(12).astype(dtype).reshape(3, 4)
        for dtype in [
            np.float64,
            np.float32,
            np.float16,
            np.int64,
            np.int32,
            np.int16,
            np.int8,
            np.uint64,
            np.uint32,
            np.uint16,
            np.uint8,
            np.bool_,
        ]
    }
    location = tmp_path / "arrays.safetensors"
    weightbay.save(arrays, location)
    loaded = weightbay.load(location, framework="numpy")
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype, name
        np.testing.assert_array_equal(loaded[name], array)


def test_numpy_says_which_tensor_it_cannot_hold(tmp_path: Path) -> None:
    weightbay.save({"w": torch.ones(2, dtype=torch.bfloat16)}, tmp_path / "m.bpk")
    with pytest.raises(TypeError, match=r"tensor 'w'.*framework='pt'"):
        weightbay.load(tmp_path / "m.bpk", framework="numpy")


def test_files_interoperate_with_safetensors(tmp_path: Path) -> None:
    tensors = {"a": sample(torch.bfloat16, (4, 4), 1), "b": sample(torch.int32, (3,), 2)}
    ours = tmp_path / "ours.safetensors"
    weightbay.save(tensors, ours, metadata={"k": "v"})
    theirs_read = safetensors.torch.load_file(ours)
    assert all(same(theirs_read[n], t) for n, t in tensors.items())
    theirs = tmp_path / "theirs.safetensors"
    safetensors.torch.save_file(tensors, theirs, metadata={"k": "v"})
    ours_read = weightbay.load(theirs)
    assert all(same(ours_read[n], t) for n, t in tensors.items())
    with weightbay.open(theirs) as container:
        assert container.metadata() == {"k": "v"}


def test_a_mapped_tensor_changed_in_place_never_changes_the_file(tmp_path: Path) -> None:
    location = tmp_path / "m.safetensors"
    weightbay.save({"w": torch.zeros(1024)}, location)
    before = location.read_bytes()
    loaded = weightbay.load(location)["w"]
    loaded.add_(1.0)
    assert float(loaded.sum()) == 1024.0
    assert location.read_bytes() == before
    assert float(weightbay.load(location)["w"].sum()) == 0.0


def test_a_store_load_gives_each_tensor_memory_of_its_own(tmp_path: Path) -> None:
    location = tmp_path / "m.bpk"
    weightbay.save({"a": torch.ones(100), "b": torch.ones(100)}, location)
    loaded = weightbay.load(location, mmap=False)
    loaded["a"].mul_(3.0)
    assert float(loaded["b"].sum()) == 100.0
    assert loaded["a"].data_ptr() % 64 == 0, "buffers are cache-line aligned"


def test_non_contiguous_tensors_are_saved_as_their_values(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    views: dict[str, Any] = {
        "transposed": base.t(),
        "sliced": base[:, ::2],
        "numpy_strided": base.numpy()[::2, 1:],
        "expanded": torch.ones(3, 1).expand(3, 5),
    }
    weightbay.save(views, tmp_path / "m.safetensors")
    loaded = weightbay.load(tmp_path / "m.safetensors")
    for name, view in views.items():
        expected = torch.as_tensor(np.ascontiguousarray(view))
        assert torch.equal(loaded[name], expected), name


def test_a_strided_dlpack_producer_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    class Producer:
        """Anything with `__dlpack__`: weightbay does not make it contiguous itself."""

        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.tensor.__dlpack__()

    location = tmp_path / "m.bpk"
    with pytest.raises(ValueError, match="tensor `t`: its elements are not contiguous"):
        weightbay.save({"ok": torch.ones(2), "t": Producer(torch.ones(3, 4).t())}, location)
    assert not location.exists()
    weightbay.save({"t": Producer(torch.arange(6).reshape(2, 3))}, location)
    assert torch.equal(weightbay.load(location)["t"], torch.arange(6).reshape(2, 3))


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (torch.zeros(2, dtype=torch.complex64), ValueError, "complex64 .* no stored equivalent"),
        (torch.zeros(3).to_sparse(), TypeError, "sparse_coo; only dense"),
        (torch.zeros(2, device="meta"), ValueError, "is on meta"),
        (3, TypeError, "is a int, not a tensor"),
        ("weights", TypeError, "is a str, not a tensor"),
    ],
)
def test_bad_input_is_refused_naming_the_tensor_and_nothing_is_written(
    tmp_path: Path, value: Any, error: type[Exception], message: str
) -> None:
    location = tmp_path / "m.safetensors"
    with pytest.raises(error, match=message) as raised:
        weightbay.save({"good": torch.ones(4), "bad": value}, location)
    assert "bad" in str(raised.value)
    assert not location.exists()
    assert os.listdir(tmp_path) == []


def test_quantized_tensors_are_refused(tmp_path: Path) -> None:
    with pytest.warns(UserWarning):
        quantized = torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match="'q' is quantized"):
        weightbay.save({"q": quantized}, tmp_path / "m.bpk")


def test_duplicate_names_are_refused_and_nothing_is_written(tmp_path: Path) -> None:
    location = tmp_path / "m.bpk"
    with pytest.raises(weightbay.InvalidInputError, match="w"):
        _native.save([("w", torch.ones(2)), ("w", torch.zeros(2))], str(location))
    assert not location.exists()


def test_a_reader_used_after_close_raises(tmp_path: Path) -> None:
    weightbay.save({"w": torch.ones(2)}, tmp_path / "m.bpk")
    with weightbay.open(tmp_path / "m.bpk") as container:
        kept = container.get_tensor("w")
    with pytest.raises(ValueError, match="is closed"):
        container.get_tensor("w")
    with pytest.raises(ValueError, match="is closed"):
        container.keys()
    assert float(kept.sum()) == 2.0, "tensors read before close stay valid"


def test_a_missing_container_is_file_not_found_naming_it(root: str) -> None:
    location = f"{root}/absent.bpk"
    with pytest.raises(FileNotFoundError) as raised:
        weightbay.load(location)
    assert isinstance(raised.value, weightbay.NotFoundError)
    assert "absent.bpk" in str(raised.value)


def test_a_missing_tensor_is_not_found_naming_it(tmp_path: Path) -> None:
    weightbay.save({"w": torch.ones(2)}, tmp_path / "m.bpk")
    with (
        weightbay.open(tmp_path / "m.bpk") as container,
        pytest.raises(weightbay.NotFoundError) as raised,
    ):
        container.get_tensor("nope")
    assert raised.value.tensor == "nope"


@pytest.mark.parametrize("mmap", [True, False])
def test_damaged_containers_raise_corrupt_naming_key_tensor_and_offset(
    tmp_path: Path, mmap: bool
) -> None:
    location = tmp_path / "m.bpk"
    weightbay.save({"a": torch.zeros(256), "b": torch.ones(256)}, location)
    data = bytearray(location.read_bytes())
    # Flip one byte of `b`'s data: the integrity trailer names the tensor.
    with weightbay.open(location) as container:
        assert container.verify() > 0
    flipped = data.rindex(np.float32(1.0).tobytes()) - 4
    data[flipped] ^= 0x01
    location.write_bytes(bytes(data))
    with (
        weightbay.open(location, mmap=mmap) as container,
        pytest.raises(weightbay.CorruptError) as raised,
    ):
        container.verify()
    assert isinstance(raised.value, ValueError)
    assert raised.value.tensor == "b"
    assert raised.value.offset is not None
    # Cut short: the header promises more bytes than the file has.
    location.write_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(weightbay.CorruptError) as truncated:
        weightbay.load(location, mmap=mmap)
    assert str(location) in str(truncated.value)
    location.write_bytes(b"not a container at all")
    with pytest.raises(weightbay.CorruptError, match="not a container"):
        weightbay.load(location, mmap=mmap)


def test_an_io_failure_carries_its_os_error_as_the_cause(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as raised:
        weightbay.load(tmp_path / "missing" / "m.bpk", mmap=False)
    assert isinstance(raised.value.__cause__, OSError)
