"""The one error the cluster tool raises: what went wrong, in words a user can act on."""
from __future__ import annotations


class ClusterError(Exception):
    """A bad description, a missing requirement (root, iproute2), or a failed system command."""


class UsageError(ClusterError):
    """Bad input: a name, state directory or option that can't be used (exit status 2)."""


class DescriptionError(UsageError):
    """A cluster description that can't be built (bad count, rate, subnet, unknown key, ...)."""
