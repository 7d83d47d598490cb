"""The state directory of one cluster: what ``up`` wrote and a journal of everything it created.

    /run/topocoll-cluster/NAME/       (or --state-dir)
      cluster.json        description, prefix, subnet, layout, holder pids
      journal.jsonl       one line per object, written *before* the object is created
      hosts               hydra machinefile (host:ranks a line)
      etc-hosts           the /etc/hosts every host sees
      topology.conf       SLURM topology.conf: leaf switches under the spine
      launch.sh           hydra's -launcher-exec: runs a command inside a host
      hN.log              what a host's namespace holder printed (errors while starting)

The journal is what ``down`` works from after a crash: an entry exists for everything that may
exist, and removing something that does not is not an error.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .errors import ClusterError

ROOT_ENV = "TOPOCOLL_CLUSTER_ROOT"
DEFAULT_ROOT = Path("/run/topocoll-cluster")


def root_dir() -> Path:
    """Where named clusters keep their state (``TOPOCOLL_CLUSTER_ROOT`` or /run/topocoll-cluster)."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


@dataclass
class StateDir:
    """A cluster's state directory."""

    path: Path

    @classmethod
    def for_cluster(cls, name: str | None = None, state_dir: str | Path | None = None) -> "StateDir":
        """``state_dir`` if given, else ``root_dir()/name`` (name defaults to ``default``)."""
        return cls(Path(state_dir) if state_dir else root_dir() / (name or "default"))

    def file(self, name: str) -> Path:
        """A file inside the directory."""
        return self.path / name

    def exists(self) -> bool:
        """Whether ``up`` has started writing here."""
        return self.file("journal.jsonl").exists() or self.file("cluster.json").exists()

    def create(self) -> None:
        """Make the directory (its parents too)."""
        self.path.mkdir(parents=True, exist_ok=True)

    def write(self, name: str, text: str, mode: int = 0o644) -> Path:
        """Write a file of the state (atomically: a temporary file renamed)."""
        p = self.file(name)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text)
        tmp.chmod(mode)
        tmp.replace(p)
        return p

    def record(self, **entry: Any) -> None:
        """Append one journal entry (flushed to disk before the caller creates the object)."""
        with open(self.file("journal.jsonl"), "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def journal(self) -> Iterator[dict[str, Any]]:
        """Journal entries in the order they were written (a torn last line is skipped)."""
        try:
            lines = self.file("journal.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue

    def prefix(self) -> str | None:
        """The cluster's name prefix, from the journal's first entry."""
        for entry in self.journal():
            if entry.get("kind") == "prefix":
                return str(entry["name"])
        return None

    def load(self) -> dict[str, Any]:
        """cluster.json, as ``up`` wrote it once the cluster was complete."""
        try:
            return dict(json.loads(self.file("cluster.json").read_text()))
        except FileNotFoundError:
            raise ClusterError(f"no cluster at {self.path} (topocoll cluster up first, or "
                               f"give --name/--state-dir)") from None
        except (OSError, json.JSONDecodeError) as e:
            raise ClusterError(f"{self.file('cluster.json')}: unreadable: {e}") from None

    def remove(self) -> None:
        """Delete the directory and everything in it."""
        if not self.path.exists():
            return
        for p in sorted(self.path.rglob("*"), reverse=True):
            if p.is_dir() and not p.is_symlink():
                p.rmdir()
            else:
                p.unlink()
        self.path.rmdir()


def named_clusters() -> list[StateDir]:
    """State directories under :func:`root_dir`."""
    root = root_dir()
    if not root.is_dir():
        return []
    return [StateDir(p) for p in sorted(root.iterdir()) if p.is_dir()]
