"""weightbay: checkpoints that land safely and load fast, on local disk or in S3, GCS and Azure.

A location is what the ``weightbay`` command takes: a path, ``file://``, ``s3://``, ``gs://`` or
``az://`` (configured by the same ``AWS_*``, ``GOOGLE_*`` and ``AZURE_*`` variables).

- :func:`save`, :func:`load` and :func:`open` handle one container (safetensors or Burnpack),
  in the shape of safetensors' ``save_file``, ``load_file`` and ``safe_open``.
- :class:`Checkpoints` keeps the checkpoints of a training run: commits written last with every
  container's CRC32C, the newest complete one, background and incremental saves, retention and
  garbage collection.

Tensors cross the boundary through DLPack, without a copy: torch tensors, numpy arrays and
anything else with ``__dlpack__`` are saved from where they lie, and loaded tensors view memory
weightbay filled once. A local file is memory-mapped privately: its tensors view the file's
pages, and changing one in place copies the touched page for this process, never the file.
Every call that touches storage releases the GIL.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Literal

from weightbay import _native
from weightbay.errors import (
    AlreadyExistsError,
    ChangedError,
    CorruptError,
    Error,
    InterruptedError,
    InvalidInputError,
    LimitExceededError,
    NotFoundError,
    StorageError,
    TimedOutError,
    UnsupportedError,
)

__all__ = [
    "AlreadyExistsError",
    "ChangedError",
    "Checkpoints",
    "Container",
    "CorruptError",
    "Error",
    "Framework",
    "InterruptedError",
    "InvalidInputError",
    "LimitExceededError",
    "NotFoundError",
    "SaveHandle",
    "StorageError",
    "TimedOutError",
    "UnsupportedError",
    "load",
    "open",
    "save",
]

__version__: str = _native.__version__

Framework = Literal["pt", "torch", "np", "numpy", "jax"]
"""What loaded tensors become: torch tensors (``"pt"``), numpy arrays or JAX arrays."""

Location = str | os.PathLike[str]


def save(
    tensors: Mapping[str, Any],
    location: Location,
    *,
    metadata: Mapping[str, str] | None = None,
    format: Literal["safetensors", "burnpack"] | None = None,
) -> None:
    """Saves ``tensors`` (name to tensor) as one container at ``location``, durably.

    The format is ``format``, or the one the file name's extension names (``.safetensors``,
    ``.bpk``), or Burnpack. Every tensor is checked before a byte is written: a tensor on a
    device, of a dtype no container stores (complex, quantized, sparse), or a value that is not
    a tensor raises naming it, and nothing is written. A non-contiguous torch tensor or numpy
    array is saved from a contiguous copy of itself.
    """
    _native.save(_exportable(tensors), os.fspath(location), _metadata(metadata), format)


def load(location: Location, *, framework: Framework = "pt", mmap: bool = True) -> dict[str, Any]:
    """Every tensor of the container at ``location``, by name, as ``framework``'s tensors.

    From a local file with ``mmap`` (the default) the tensors view the mapped file; from
    anywhere else each lands once in memory of its own, fetched in parallel.
    """
    return {
        name: _convert(name, tensor, framework)
        for name, tensor in _native.load(os.fspath(location), mmap)
    }


class Container:
    """A container opened for reading tensor by tensor, as safetensors' ``safe_open``.

    Use it in a ``with`` block, or call :meth:`close`; any use after that raises ``ValueError``.
    Tensors already read stay valid after it closes.
    """

    def __init__(self, inner: _native.Container, framework: Framework) -> None:
        self._inner = inner
        self._framework = framework

    def keys(self) -> list[str]:
        """The tensor names, in the container's order."""
        return self._inner.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def metadata(self) -> dict[str, str]:
        """The container's string metadata."""
        return self._inner.metadata()

    def format(self) -> str:
        """``"safetensors"`` or ``"burnpack"``."""
        return self._inner.format()

    def info(self, name: str) -> tuple[str, list[int]]:
        """A tensor's stored dtype (``"BF16"``) and shape, without reading it."""
        return self._inner.info(name)

    def get_tensor(self, name: str) -> Any:
        """One tensor, read now."""
        return self.get_tensors([name])[name]

    def get_tensors(self, names: list[str]) -> dict[str, Any]:
        """The named tensors, read together in one batch the store may fetch in parallel."""
        tensors = self._inner.get_tensors(names)
        return {
            name: _convert(name, tensor, self._framework)
            for name, tensor in zip(names, tensors, strict=True)
        }

    def verify(self) -> int:
        """Reads every byte and checks it (against the integrity trailer, when the container
        has one); returns the number of bytes checked. Raises :class:`CorruptError`."""
        return self._inner.verify()

    def close(self) -> None:
        """Ends this reader."""
        self._inner.close()

    def __enter__(self) -> Container:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def open(location: Location, *, framework: Framework = "pt", mmap: bool = True) -> Container:
    """Opens the container at ``location`` for reading tensor by tensor."""
    return Container(_native.Container(os.fspath(location), mmap), framework)


class SaveHandle:
    """A checkpoint saving in the background."""

    def __init__(self, inner: _native.SaveHandle) -> None:
        self._inner = inner

    @property
    def step(self) -> int:
        """The step being saved."""
        return self._inner.step

    def done(self) -> bool:
        """Whether the save has ended, committed or failed."""
        return self._inner.done()

    def wait(self) -> None:
        """Waits for the save to commit, and raises its failure."""
        self._inner.wait()


class Checkpoints:
    """The checkpoints of a training run under one prefix (``runs/exp1``, ``s3://b/runs/exp1``).

    A checkpoint exists exactly when its commit record does. The record is written last and
    holds every container's CRC32C, so a save killed at any moment is never loaded as complete.
    """

    def __init__(self, location: Location, *, framework: Framework = "pt") -> None:
        self._inner = _native.Checkpoints(os.fspath(location))
        self._framework = framework

    def save(
        self,
        step: int,
        tensors: Mapping[str, Any],
        *,
        metadata: Mapping[str, str] | None = None,
        format: Literal["safetensors", "burnpack"] | None = None,
        incremental: bool = False,
        compress: bool = False,
    ) -> None:
        """Saves ``tensors`` as checkpoint ``step`` and commits it.

        ``metadata`` goes into the commit record. ``incremental`` writes only the 1 MiB pieces
        no earlier checkpoint holds; the checkpoint still reads as a whole one. ``compress``
        (incremental too) stores each piece it writes losslessly encoded where that makes it
        smaller: bf16 and f32 weights by about a third and a sixth. Raises
        :class:`AlreadyExistsError` when ``step`` is committed already.
        """
        self._inner.save(
            step, _exportable(tensors), _metadata(metadata), format, incremental, compress
        )

    def save_in_background(
        self,
        step: int,
        tensors: Mapping[str, Any],
        *,
        metadata: Mapping[str, str] | None = None,
        format: Literal["safetensors", "burnpack"] | None = None,
        incremental: bool = False,
        compress: bool = False,
    ) -> SaveHandle:
        """Starts saving ``step`` on a thread of its own; returns once the tensors are copied.

        The save keeps the values the tensors had at the call, whatever training does to them
        next; the copy costs their size in host memory until the save ends. One save is in
        flight at a time: a second call first waits for the first.
        """
        return SaveHandle(
            self._inner.save_in_background(
                step, _exportable(tensors), _metadata(metadata), format, incremental, compress
            )
        )

    def latest(self) -> int | None:
        """The newest complete checkpoint's step, or ``None``; never a save that did not
        commit."""
        return self._inner.latest()

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        return self._inner.steps()

    def open(self, step: int | None = None) -> Container:
        """Opens checkpoint ``step``, or the latest complete one."""
        return Container(self._inner.open(step), self._framework)

    def load(self, step: int | None = None) -> dict[str, Any]:
        """Every tensor of checkpoint ``step``, or of the latest complete one."""
        with self.open(step) as container:
            return container.get_tensors(container.keys())

    def retain(self, *, keep_last: int | None = None, keep_every: int | None = None) -> list[int]:
        """Deletes the checkpoints the policy does not keep (never the newest complete one)
        and returns their steps."""
        return self._inner.retain(keep_last, keep_every)

    def gc(self, *, dry_run: bool = False) -> dict[str, list[str]]:
        """Removes what no complete checkpoint refers to (saves that never committed, once a
        newer checkpoint is complete; abandoned uploads); ``dry_run`` only reports."""
        return self._inner.gc(dry_run)

    def verify(self, step: int | None = None) -> int:
        """Checks checkpoint ``step`` (or the latest) against its commit record's CRC32C;
        returns the bytes read. Raises :class:`CorruptError`."""
        return self._inner.verify(step)

    def flush(self) -> None:
        """Waits for the background save in flight and raises the failure of any whose handle
        was dropped. Call it before the program exits."""
        self._inner.flush()


def _metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str; {key!r} maps to {value!r}")
    return dict(metadata)


def _exportable(tensors: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``tensors`` as (name, DLPack object) pairs, every one checked before anything is
    written."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name to tensor, not {type(tensors)}")
    return [(_name(name), _prepared(name, value)) for name, value in tensors.items()]


def _name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"tensor names are str, not {type(name).__name__} ({name!r})")
    return name


def _prepared(name: str, value: Any) -> Any:
    """``value`` ready for ``__dlpack__``: a torch tensor detached from autograd and made
    contiguous, a numpy array made contiguous; anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            raise TypeError(f"tensor {name!r} is {value.layout}; only dense tensors are stored")
        if value.is_quantized:
            raise TypeError(f"tensor {name!r} is quantized ({value.dtype}); it has no stored form")
        if value.device.type != "cpu":
            raise ValueError(
                f"tensor {name!r} is on {value.device}; weightbay reads host memory: "
                "move it with .cpu() first"
            )
        return value.detach().contiguous()
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return numpy.ascontiguousarray(value)
    if not hasattr(value, "__dlpack__"):
        raise TypeError(
            f"tensor {name!r} is a {type(value).__name__}, not a tensor "
            "(torch, numpy, JAX or anything with __dlpack__)"
        )
    return value


def _convert(name: str, tensor: _native.HostTensor, framework: Framework) -> Any:
    """A loaded tensor as ``framework``'s, sharing its memory."""
    if framework in ("pt", "torch"):
        import torch

        return torch.from_dlpack(tensor)
    if framework in ("np", "numpy"):
        import numpy

        try:
            return numpy.from_dlpack(tensor)
        except (BufferError, RuntimeError) as error:
            raise TypeError(
                f"tensor {name!r} has a dtype numpy cannot hold ({error}); "
                "load it with framework='pt'"
            ) from error
    if framework == "jax":
        import jax.numpy

        return jax.numpy.from_dlpack(tensor)
    raise ValueError(f"unknown framework {framework!r}: 'pt', 'numpy' or 'jax'")
