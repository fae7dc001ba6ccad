"""The exceptions weightbay raises.

Each is a :class:`Error` and also the built-in exception Python code already catches for that
kind of failure: a missing container is a :class:`FileNotFoundError`, a damaged one a
:class:`ValueError`. Each carries what the error names: the ``key`` (the container or object),
the ``tensor`` and the byte ``offset``, where they apply, and ``kind``, weightbay's word for the
failure. The cause (an ``OSError`` with its errno, a store's message) is ``__cause__``.
"""

from __future__ import annotations

__all__ = [
    "AlreadyExistsError",
    "ChangedError",
    "CorruptError",
    "Error",
    "InterruptedError",
    "InvalidInputError",
    "LimitExceededError",
    "NotFoundError",
    "StorageError",
    "TimedOutError",
    "UnsupportedError",
]

import builtins


class Error(Exception):
    """Any failure weightbay reports."""

    kind: str | None = None
    key: str | None = None
    tensor: str | None = None
    offset: int | None = None


class NotFoundError(Error, FileNotFoundError):
    """The container, object, checkpoint or tensor does not exist."""


class AlreadyExistsError(Error, FileExistsError):
    """Something is already there (a step committed by another save)."""


class CorruptError(Error, ValueError):
    """The bytes are not a valid container, or do not match their checksum."""


class LimitExceededError(Error, ValueError):
    """A declared size or count is over one of the reader's hardening limits."""


class InvalidInputError(Error, ValueError):
    """What the caller passed is invalid (a duplicate tensor name, a bad location)."""


class UnsupportedError(Error, NotImplementedError):
    """The store does not offer the operation."""


class ChangedError(Error):
    """An object changed while it was read; nothing mixed was returned. Open it again."""


class StorageError(Error, OSError):
    """The disk, network or object store failed."""


class InterruptedError(Error, builtins.InterruptedError):
    """The operation was cancelled."""


class TimedOutError(Error, TimeoutError):
    """The operation did not finish by its deadline and was given up."""
