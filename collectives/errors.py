"""The package's error classes: what went wrong is in the type, and the message names the culprit."""
from __future__ import annotations


class CollectiveError(RuntimeError):
    """A collective could not complete (bad agreement between ranks, a broken communicator, ...)."""


class MismatchError(CollectiveError, ValueError):
    """Ranks called the same collective with different shapes, dtypes, roots, ops or algorithms.
    ``field``: what differed, where the cross-rank check found it ("collective", "dtype", ...)."""

    field: str | None = None


class MessageTruncated(MismatchError):
    """A received message was larger than the buffer it was received into (MPI_ERR_TRUNCATE):
    the message is consumed, so the channel stays in step; the buffer holds its first bytes."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A peer did not arrive within the timeout; the message names the operation and the peer."""


class CommunicatorBrokenError(CollectiveError):
    """A previous operation timed out or failed mid-transfer, so the communicator can't be trusted."""


class TransportError(CollectiveError):
    """The transport (MPI, NCCL) failed mid-operation: a peer process died or a link broke. The
    message names the operation and, where known, the peers it was waiting for; the
    communicator is broken afterwards."""
