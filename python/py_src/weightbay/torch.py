"""A storage plugin for PyTorch Distributed Checkpoint (DCP): weightbay's commits under DCP.

Swap one argument of ``dcp.save`` and ``dcp.load``::

    import torch.distributed.checkpoint as dcp
    import weightbay.torch

    dcp.save(state_dict, storage_writer=weightbay.torch.StorageWriter("s3://b/run", step=100))
    dcp.load(state_dict, storage_reader=weightbay.torch.StorageReader("s3://b/run"))

A checkpoint is a weightbay multi-rank checkpoint, step ``step`` under the run prefix:

- every rank streams the items DCP plans for it into one container of its own (safetensors by
  default: it stores every dtype torch trains in, float8 included) and a manifest with the
  container's CRC32C;
- the coordinator's ``finish`` writes the commit record, last. A save killed at any moment,
  on any rank, is never loaded as complete, and ``weightbay.Checkpoints(location).latest()``
  never names it;
- DCP's metadata is not stored as a pickle: the reader rebuilds it from the commit record
  (every tensor's dtype, shape and the boxes the ranks saved), so nothing unpickled comes from
  storage but what DCP's own planner unpickles (its ``BYTE_IO`` items, non-tensor values it
  saved with ``torch.save``, loaded with ``torch.load``, as with ``FileSystemReader``).

Loads reshard as DCP does: any rank layout reads any other, each rank fetching only the byte
runs of the boxes its planner asks for, into the state dict's own tensors where they are
contiguous host tensors of the stored dtype (others are read and copied with ``copy_``).
The run prefix is a weightbay run like any other: ``weightbay ls``, ``verify``, ``gc`` and
``cp`` work on it, and :class:`weightbay.Checkpoints` retains and collects it.

:class:`StorageReader` also reads a local directory DCP's ``FileSystemWriter`` wrote, without
trusting its pickle (see :mod:`weightbay._dcp_files`).

What is not here: incremental saves and tiered locations through DCP, DCP's mode without
collectives (``use_collectives=False``), and ``FileSystemReader`` reading what
:class:`StorageWriter` saves.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

import weightbay
from weightbay import _native
from weightbay._dcp_files import FileSystemCheckpointReader, is_filesystem_checkpoint

__all__ = ["StorageReader", "StorageWriter"]

DCP_METADATA_KEY = "torch.dcp"
"""The commit record's metadata key holding what DCP's metadata needs beyond the record."""

READ_BATCH_BYTES = 256 << 20
"""The bytes one batched read of a load lands before they are copied into the state dict:
a rank never holds more of the checkpoint than this beside its own tensors."""

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
"""Stored dtypes (safetensors' spelling) and the torch dtype each loads as."""

_STEP_DIR = re.compile(r"^(?P<run>.+)/step-(?P<step>[0-9]+)/?$")


def _split(checkpoint_id: str | os.PathLike[str]) -> tuple[str, int] | None:
    """``"s3://b/run/step-100"`` as ``("s3://b/run", 100)``; ``None`` for anything else."""
    matched = _STEP_DIR.match(os.fspath(checkpoint_id))
    if matched is None:
        return None
    return matched["run"], int(matched["step"])


@dataclasses.dataclass(frozen=True)
class _RankPlan:
    """What the coordinator's global plan tells each rank (``SavePlan.storage_data``)."""

    rank: int
    world_size: int
    catalog: str | None
    """For rank 0, whose metadata becomes the commit record's: :data:`DCP_METADATA_KEY`."""


class StorageWriter(dcp.StorageWriter, BlockingAsyncStager):
    """Saves a DCP checkpoint as step ``step`` of the weightbay run at ``location``.

    ``location`` is any location :mod:`weightbay` takes (a path, ``s3://``, ``gs://``,
    ``az://``). The step may instead come from ``dcp.save(..., checkpoint_id=".../step-N")``.
    ``format`` is the containers' (``"safetensors"`` or ``"burnpack"``).

    For ``dcp.async_save`` it stages as ``FileSystemWriter`` does (``BlockingAsyncStager``):
    the state dict is copied into host memory of its own, as large as its tensors, before the
    call returns, and the save writes the copy.
    """

    def __init__(
        self,
        location: str | os.PathLike[str] | None = None,
        step: int | None = None,
        *,
        format: str = "safetensors",
    ) -> None:
        dcp.StorageWriter.__init__(self)
        BlockingAsyncStager.__init__(self)
        self._location = None if location is None else os.fspath(location)
        self._step = step
        self._format = format
        self._plan: _RankPlan | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self._location, self._step = _parsed(checkpoint_id)
        self._plan = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _split(checkpoint_id) is not None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise ValueError(
                "weightbay.torch.StorageWriter commits once every rank has written, which "
                "needs DCP's collectives: save without use_collectives=False"
            )
        self._checkpoints()

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self._checkpoint_id())

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Gives each rank its place (plans come in rank order) and rank 0 the catalog the
        commit record keeps: which items are DCP's pickled objects, and the planner's data."""
        byte_items = sorted(
            item.index.fqn
            for plan in plans
            for item in plan.items
            if item.type == WriteItemType.BYTE_IO
        )
        planner_data: dict[str, Any] = {}
        for plan in plans:
            if isinstance(plan.planner_data, dict):
                planner_data.update(plan.planner_data)
        try:
            catalog = json.dumps({"version": 1, "bytes": byte_items, "planner_data": planner_data})
        except TypeError as error:
            raise TypeError(
                f"the save planner's data cannot be kept in the commit record ({error}); "
                "weightbay.torch stores DefaultSavePlanner's"
            ) from error
        return [
            dataclasses.replace(
                plan,
                storage_data=_RankPlan(rank, len(plans), catalog if rank == 0 else None),
            )
            for rank, plan in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Streams this rank's items into its container and writes its manifest; the commit is
        the coordinator's, in :meth:`finish`."""
        place = plan.storage_data
        if not isinstance(place, _RankPlan):
            raise TypeError("this plan was not prepared by weightbay.torch.StorageWriter")
        self._plan = place
        tensors: dict[str, Any] = {}
        slices: dict[str, tuple[list[int], list[int]]] = {}
        results: list[WriteResult] = []
        for item in plan.items:
            name = item.index.fqn
            if name in tensors:
                raise ValueError(
                    f"rank {place.rank} holds two chunks of {name!r}; weightbay.torch stores "
                    "one box of a tensor per rank"
                )
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                if not isinstance(data, io.BytesIO):
                    raise TypeError(f"item {name!r} is a BYTE_IO item without bytes")
                tensor = (
                    torch.frombuffer(bytearray(data.getbuffer()), dtype=torch.uint8)
                    if data.getbuffer().nbytes
                    else torch.empty(0, dtype=torch.uint8)
                )
            else:
                if not isinstance(data, torch.Tensor) or item.tensor_data is None:
                    raise TypeError(f"item {name!r} is a tensor item without a tensor")
                tensor = data
                whole = list(item.tensor_data.size)
                chunk = item.tensor_data.chunk
                if list(chunk.sizes) != whole:
                    slices[name] = (whole, list(chunk.offsets))
            tensors[name] = tensor
            results.append(
                WriteResult(
                    index=item.index,
                    size_in_bytes=tensor.numel() * tensor.element_size(),
                    storage_data=place.rank,
                )
            )
        metadata = None if place.catalog is None else {DCP_METADATA_KEY: place.catalog}
        self._checkpoints().save_rank(
            self._step_number(),
            place.rank,
            place.world_size,
            weightbay._exportable(tensors),
            slices,
            metadata,
            self._format,
            False,
        )
        written: Future[list[WriteResult]] = Future()
        written.set_result(results)
        return written

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commits the checkpoint from every rank's manifest: the record, written last, is the
        checkpoint."""
        self._checkpoints().commit_ranks(self._step_number(), len(results))

    def _checkpoints(self) -> _native.Checkpoints:
        if self._location is None:
            raise ValueError(
                "weightbay.torch.StorageWriter needs a location: StorageWriter(location, "
                "step=N) or dcp.save(..., checkpoint_id='<run>/step-N')"
            )
        return _native.Checkpoints(self._location)

    def _step_number(self) -> int:
        if self._step is None:
            raise ValueError(
                "weightbay.torch.StorageWriter needs a step: StorageWriter(location, step=N) "
                "or dcp.save(..., checkpoint_id='<run>/step-N')"
            )
        return self._step

    def _checkpoint_id(self) -> str | None:
        if self._location is None or self._step is None:
            return None
        return f"{self._location}/step-{self._step}"


class StorageReader(dcp.StorageReader):
    """Loads a DCP checkpoint saved by :class:`StorageWriter`: step ``step`` of the run at
    ``location``, or its newest complete checkpoint. The step may instead come from
    ``dcp.load(..., checkpoint_id=".../step-N")``.

    A local directory DCP's own ``FileSystemWriter`` completed (it holds ``.metadata``) is
    read too, as ``FileSystemReader`` reads it but with its pickled metadata unpickled from
    an allowlist of the classes DCP's metadata is made of, and every item's file checked to
    be a plain name inside the directory: load it here and save it with
    :class:`StorageWriter` to move a run over. The other direction does not work:
    ``FileSystemReader`` cannot read what :class:`StorageWriter` saves."""

    def __init__(
        self, location: str | os.PathLike[str] | None = None, step: int | None = None
    ) -> None:
        super().__init__()
        self._location = None if location is None else os.fspath(location)
        self._step = step
        self._assembled: _native.Assembled | None = None
        self._layout: dict[str, tuple[str, list[int], list[tuple[list[int], list[int]]]]] = {}
        self._files = self._filesystem_reader(location, step)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self._assembled = None
        if checkpoint_id is not None:
            self._files = self._filesystem_reader(checkpoint_id, None)
            if self._files is None:
                self._location, self._step = _parsed(checkpoint_id)
        elif self._files is not None:
            self._files.reset()

    @staticmethod
    def _filesystem_reader(
        location: str | os.PathLike[str] | None, step: int | None
    ) -> FileSystemCheckpointReader | None:
        """The reader of ``location`` when it is a checkpoint ``FileSystemWriter`` wrote."""
        if location is None or step is not None or not is_filesystem_checkpoint(location):
            return None
        return FileSystemCheckpointReader(os.fspath(location).removeprefix("file://"))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return _split(checkpoint_id) is not None or is_filesystem_checkpoint(checkpoint_id)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata, rebuilt from the commit record: nothing is unpickled."""
        if self._files is not None:
            return self._files.read_metadata(*args, **kwargs)
        assembled = self._open()
        catalog = _catalog(assembled)
        byte_items = set(catalog.get("bytes", []))
        state_dict_metadata: dict[str, Any] = {}
        storage_data: dict[MetadataIndex, int] = {}
        for name, (dtype, shape, boxes) in self._layout.items():
            if name in byte_items:
                state_dict_metadata[name] = BytesStorageMetadata()
                storage_data[MetadataIndex(name)] = assembled.step
                continue
            if dtype not in _DTYPES:
                raise weightbay.UnsupportedError(
                    f"tensor {name!r} is {dtype}, which torch has no dtype for"
                )
            state_dict_metadata[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_DTYPES[dtype]),
                size=torch.Size(shape),
                chunks=[
                    ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(lengths))
                    for offsets, lengths in boxes
                ],
            )
            for offsets, _ in boxes:
                storage_data[MetadataIndex(name, torch.Size(offsets))] = assembled.step
        planner_data = {
            key: tuple(path) if isinstance(path, list) else path
            for key, path in catalog.get("planner_data", {}).items()
        }
        return Metadata(
            state_dict_metadata=state_dict_metadata,
            planner_data=planner_data,
            storage_data=storage_data,
            storage_meta=StorageMeta(checkpoint_id=f"{self._location}/step-{assembled.step}"),
        )

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """Pins every rank to the step the coordinator's metadata describes, though a newer one
        may commit meanwhile."""
        if self._files is not None:
            self._files.set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
            return
        meta = metadata.storage_meta
        if meta is not None and meta.checkpoint_id is not None:
            pinned = _split(meta.checkpoint_id)
            if pinned is not None and pinned[1] != self._step:
                self._step = pinned[1]
                self._assembled = None

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        if self._files is not None:
            return self._files.prepare_local_plan(plan)
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        if self._files is not None:
            planned: list[LoadPlan] = self._files.prepare_global_plan(plans)
            return planned
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Reads the boxes the plan asks for, in batches of at most :data:`READ_BATCH_BYTES`,
        each batch one fetch per container of only the byte runs it needs. A box whose target
        is a contiguous host tensor of the stored dtype lands in the target's own memory; any
        other is read into memory of its own and copied (``copy_`` converts dtypes)."""
        if self._files is not None:
            return self._files.read_data(plan, planner)
        assembled = self._open()
        for batch in self._batches(plan.items):
            # Each target is resolved once: a planner's resolve_tensor may do work.
            in_place: list[tuple[ReadItem, torch.Tensor]] = []
            copied: list[tuple[ReadItem, torch.Tensor | None]] = []
            for item in batch:
                target = None
                if item.type != LoadItemType.BYTE_IO:
                    target = planner.resolve_tensor(item).detach()
                    self._check_shape(item, target.shape)
                if target is not None and self._lands_in_place(item, target):
                    in_place.append((item, target))
                else:
                    copied.append((item, target))
            assembled.read_regions_into(
                [(*self._region(item), target) for item, target in in_place]
            )
            for item, target in in_place:
                planner.commit_tensor(item, target)
            wanted = [self._region(item) for item, _ in copied]
            for (item, target), landed in zip(copied, assembled.read_regions(wanted), strict=True):
                if target is None:
                    planner.load_bytes(
                        item, io.BytesIO(torch.from_dlpack(landed).numpy().tobytes())
                    )
                    continue
                target.copy_(torch.from_dlpack(landed))
                planner.commit_tensor(item, target)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _check_shape(self, item: ReadItem, shape: torch.Size) -> None:
        if list(shape) != list(item.lengths):
            raise weightbay.CorruptError(
                f"tensor {item.storage_index.fqn!r}: the box read has shape "
                f"{list(item.lengths)}, the state dict's {list(shape)}"
            )

    def _lands_in_place(self, item: ReadItem, target: torch.Tensor) -> bool:
        stored = self._layout.get(item.storage_index.fqn)
        return (
            stored is not None
            and _DTYPES.get(stored[0]) == target.dtype
            and target.device.type == "cpu"
            and target.is_contiguous()
        )

    def _open(self) -> _native.Assembled:
        if self._assembled is None:
            if self._location is None:
                raise ValueError(
                    "weightbay.torch.StorageReader needs a location: StorageReader(location) "
                    "or dcp.load(..., checkpoint_id='<run>/step-N')"
                )
            self._assembled = _native.Checkpoints(self._location).assembled(self._step)
            self._step = self._assembled.step
            self._layout = self._assembled.tensors()
        return self._assembled

    def _region(self, item: ReadItem) -> tuple[str, list[int], list[int]]:
        """The box of the stored tensor ``item`` reads, in the whole tensor's coordinates."""
        name = item.storage_index.fqn
        if item.type == LoadItemType.BYTE_IO:
            return name, [0], self._shape(name)
        base = item.storage_index.offset or torch.Size([0] * len(item.lengths))
        offsets = [b + o for b, o in zip(base, item.storage_offsets, strict=True)]
        return name, offsets, list(item.lengths)

    def _shape(self, name: str) -> list[int]:
        if name not in self._layout:
            raise weightbay.NotFoundError(f"no item {name!r} in the checkpoint")
        return self._layout[name][1]

    def _batches(self, items: list[ReadItem]) -> Iterator[list[ReadItem]]:
        """``items`` in runs that land at most :data:`READ_BATCH_BYTES` (or one item)."""
        batch: list[ReadItem] = []
        size = 0
        for item in items:
            name = item.storage_index.fqn
            dtype = self._layout[name][0] if name in self._layout else "U8"
            lengths = self._shape(name) if item.type == LoadItemType.BYTE_IO else item.lengths
            bytes_read = _DTYPES.get(dtype, torch.uint8).itemsize * _elements(lengths)
            if batch and size + bytes_read > READ_BATCH_BYTES:
                yield batch
                batch, size = [], 0
            batch.append(item)
            size += bytes_read
        if batch:
            yield batch


def _parsed(checkpoint_id: str | os.PathLike[str]) -> tuple[str, int]:
    split = _split(checkpoint_id)
    if split is None:
        raise ValueError(
            f"checkpoint_id {os.fspath(checkpoint_id)!r} is not a step of a run: "
            "'<run location>/step-<N>'"
        )
    return split


def _catalog(assembled: _native.Assembled) -> dict[str, Any]:
    text = assembled.metadata().get(DCP_METADATA_KEY)
    if text is None:
        return {}
    try:
        catalog = json.loads(text)
    except json.JSONDecodeError as error:
        raise weightbay.CorruptError(
            f"the commit record's {DCP_METADATA_KEY!r} is not JSON: {error}"
        ) from error
    if not isinstance(catalog, dict):
        raise weightbay.CorruptError(f"the commit record's {DCP_METADATA_KEY!r} is not an object")
    return catalog


def _elements(lengths: Iterable[int]) -> int:
    elements = 1
    for length in lengths:
        elements *= length
    return elements
