"""Checkpoints DCP's own ``FileSystemWriter`` wrote, read without trusting their pickle.

``FileSystemReader`` loads a checkpoint's ``.metadata`` with ``pickle.load``: a planted file
runs any code it names. This reader unpickles it with only the classes DCP's metadata is made
of (its dataclasses, ``torch.Size``, torch's dtypes and layouts, a path), checks every item's
file is a plain name inside the checkpoint's directory, and leaves the rest to
``FileSystemReader``, whose tensor reads are ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

import weightbay

METADATA_FILE = ".metadata"
"""The file ``FileSystemWriter`` writes last: its checkpoint is complete when this exists."""

_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
"""What DCP's metadata pickles are made of (torch 2.15), and nothing that runs code."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise weightbay.CorruptError(
            f"{self._path}: the metadata names {module}.{name}, which DCP's metadata is not made "
            "of; it is not unpickled"
        )


def is_filesystem_checkpoint(location: str | os.PathLike[str]) -> bool:
    """Whether ``location`` is a local directory ``FileSystemWriter`` completed."""
    text = os.fspath(location)
    if "://" in text and not text.startswith("file://"):
        return False
    return (Path(text.removeprefix("file://")) / METADATA_FILE).is_file()


class FileSystemCheckpointReader(dcp.FileSystemReader):
    """``FileSystemReader`` with its metadata unpickled from an allowlist and checked."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        path = Path(self._get_metadata_path(rank))
        try:
            with open(path, "rb") as file:
                metadata = _MetadataUnpickler(file, path).load()
        except (weightbay.CorruptError, FileNotFoundError):
            raise
        except Exception as error:  # any other failure of a parse of untrusted bytes
            raise weightbay.CorruptError(f"{path}: not DCP's metadata: {error}") from error
        if not isinstance(metadata, Metadata):
            raise weightbay.CorruptError(
                f"{path}: holds a {type(metadata).__name__}, not DCP's Metadata"
            )
        for index, info in (metadata.storage_data or {}).items():
            item = getattr(index, "fqn", index)
            name = getattr(info, "relative_path", None)
            if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name:
                raise weightbay.CorruptError(
                    f"{path}: item {item!r} names the file {name!r}, which is not a plain "
                    "name inside the checkpoint's directory"
                )
            offset, length = getattr(info, "offset", None), getattr(info, "length", None)
            if (
                not isinstance(offset, int)
                or not isinstance(length, int)
                or min(offset, length) < 0
            ):
                raise weightbay.CorruptError(
                    f"{path}: item {item!r} has offset {offset!r} and length {length!r}"
                )
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
