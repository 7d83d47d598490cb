"""The state directory of one cluster: what ``up`` wrote and a journal of everything it created.

    /run/topocoll-cluster/NAME/       (or --state-dir)
      cluster.json        description, prefix, subnet, layout, holder pids
      journal.jsonl       one line per object, written *before* the object is created
      hosts               hydra machinefile (host:ranks a line)
      etc-hosts           the /etc/hosts every host sees
      topology.conf       SLURM topology.conf: leaf switches under the spine
      launch.sh           hydra's -launcher-exec: runs a command inside a host
      hN.log, hN.pid      what a host's namespace holder printed (errors while starting), its pid

The journal is what ``down`` works from after a crash: an entry exists for everything that may
exist, and removing something that does not is not an error. ``down`` (and a failed ``up``)
delete only files of these names, and only the directories ``up`` made (the journal says
which), once they are empty: whatever else the directory holds stays.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .description import check_name
from .errors import ClusterError, UsageError

ROOT_ENV = "TOPOCOLL_CLUSTER_ROOT"
DEFAULT_ROOT = Path("/run/topocoll-cluster")
WRITTEN = re.compile(r"(cluster\.json|journal\.jsonl|hosts|etc-hosts|topology\.conf|launch\.sh"
                     r"|h[0-9]+\.(?:log|pid))(?:\.tmp)?")
"""Names of the files ``up`` writes into a state directory (and their temporary names): the only
files ``down`` or a failed ``up`` ever delete."""
_PREFIX = re.compile(r"tcc[0-9a-f]{4}")


def root_dir() -> Path:
    """Where named clusters keep their state (``TOPOCOLL_CLUSTER_ROOT`` or /run/topocoll-cluster)."""
    return Path(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


@dataclass
class StateDir:
    """A cluster's state directory."""

    path: Path

    @classmethod
    def for_cluster(cls, name: str | None = None, state_dir: str | Path | None = None) -> "StateDir":
        """``state_dir`` if given, else ``root_dir()/name`` (name defaults to ``default``). A
        name is checked as ``up`` checks it (no ``/``, no ``..``): it must stay under the root."""
        if name is not None:
            check_name(name)
        if state_dir:
            return cls(Path(state_dir))
        root = root_dir()
        if root.exists() and not root.is_dir():
            raise UsageError(f"the state root {root} ({ROOT_ENV} or {DEFAULT_ROOT}) is not a "
                             f"directory; point {ROOT_ENV} at a directory, or give --state-dir")
        return cls(root / (name or "default"))

    def file(self, name: str) -> Path:
        """A file inside the directory."""
        return self.path / name

    def exists(self) -> bool:
        """Whether ``up`` has started writing here (the directory holds a cluster's state)."""
        return self.file("journal.jsonl").exists() or self.file("cluster.json").exists()

    def written(self) -> list[str]:
        """Names of the files here that ``up`` writes (whoever wrote them)."""
        try:
            return sorted(p.name for p in self.path.iterdir() if WRITTEN.fullmatch(p.name))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as e:
            raise UsageError(f"state directory {self.path}: cannot list: {e.strerror}") from None

    def create(self) -> list[Path]:
        """Make the directory and its missing parents and claim it (an empty journal); return
        the directories made, outermost first.

        A directory that already holds files of the names ``up`` writes is refused: they would
        be overwritten, and later removed by ``down``; so is one another ``up`` claimed first."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"state directory {self.path} is not a directory")
        clash = self.written()
        if clash:
            raise UsageError(f"state directory {self.path} already holds {', '.join(clash)}, "
                             f"which `topocoll cluster up` would overwrite; choose a new or "
                             f"empty directory")
        path = self.path.absolute()
        made: list[Path] = []
        for d in [d for d in (path, *path.parents) if not d.exists()][::-1]:
            try:
                d.mkdir()
            except FileExistsError:
                continue                          # made by someone else meanwhile: not ours
            except OSError as e:
                self.remove_dirs(made)
                at = "" if d == path else f" ({d})"
                raise UsageError(f"cannot create the state directory {self.path}: "
                                 f"{e.strerror}{at}") from None
            made.append(d)
        if not self.path.is_dir():
            raise UsageError(f"state directory {self.path} is not a directory")
        try:  # the claim: of two `up`s racing for this directory, one makes the journal
            self.file("journal.jsonl").open("x").close()
        except FileExistsError:
            self.remove_dirs(made)
            raise UsageError(f"state directory {self.path}: another `topocoll cluster up` is "
                             f"bringing a cluster up there (its journal.jsonl appeared "
                             f"meanwhile); wait for it, or choose another --name/--state-dir") \
                from None
        except OSError as e:
            self.remove_dirs(made)
            raise UsageError(f"cannot write to the state directory {self.path}: "
                             f"{e.strerror}") from None
        return made

    def write(self, name: str, text: str, mode: int = 0o644) -> Path:
        """Write a file of the state (atomically: a temporary file renamed)."""
        assert WRITTEN.fullmatch(name), name
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
        except (FileNotFoundError, NotADirectoryError):
            return
        except (OSError, UnicodeDecodeError) as e:
            raise ClusterError(f"{self.file('journal.jsonl')}: unreadable: {e}") from None
        for line in lines:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict):
                yield entry

    def prefix(self) -> str | None:
        """The cluster's name prefix, from the journal's first entry (or cluster.json's)."""
        for entry in self.journal():
            if entry.get("kind") == "prefix" and _PREFIX.fullmatch(str(entry.get("name"))):
                return str(entry["name"])
        try:
            data = json.loads(self.file("cluster.json").read_text())
        except (OSError, ValueError):
            return None
        found = data.get("prefix") if isinstance(data, dict) else None
        return found if isinstance(found, str) and _PREFIX.fullmatch(found) else None

    def load(self) -> dict[str, Any]:
        """cluster.json, as ``up`` wrote it once the cluster was complete."""
        try:
            data = json.loads(self.file("cluster.json").read_text())
        except (FileNotFoundError, NotADirectoryError):
            raise ClusterError(f"no cluster at {self.path} (topocoll cluster up first, or "
                               f"give --name/--state-dir)") from None
        except (OSError, ValueError) as e:
            raise ClusterError(f"{self.file('cluster.json')}: unreadable: {e}") from None
        if not isinstance(data, dict):
            raise ClusterError(f"{self.file('cluster.json')}: damaged (not an object); `topocoll "
                               f"cluster down` still takes the cluster down (it works from the "
                               f"journal)")
        return data

    def made_dirs(self) -> list[Path]:
        """The directories ``up`` made for this state, outermost first, as its journal says
        (none when it doesn't say: a directory is kept unless it is known to be ``up``'s)."""
        path = self.path.absolute()
        for entry in self.journal():
            if entry.get("kind") == "state_dir" and isinstance(entry.get("made"), list):
                made = [Path(str(d)) for d in entry["made"]]
                return [d for d in made if d == path or d in path.parents]
        return []

    def remove(self, made: list[Path] | None = None) -> list[str]:
        """Delete the files ``up`` writes (:data:`WRITTEN`), never anything else, then the
        directories ``up`` made (``made``, else as the journal says) that are left empty.
        Returns the names of other files that stay."""
        if not self.path.is_dir():
            return []
        made = self.made_dirs() if made is None else made
        for name in self.written():
            p = self.file(name)
            if p.is_symlink() or not p.is_dir():
                p.unlink(missing_ok=True)
        others = sorted(p.name for p in self.path.iterdir())
        if not others:
            self.remove_dirs(made)
        return others

    @staticmethod
    def remove_dirs(made: list[Path]) -> None:
        """Remove these directories (outermost first in the list), innermost first, while
        empty."""
        for d in reversed(made):
            try:
                d.rmdir()
            except OSError:
                return


def named_clusters() -> list[StateDir]:
    """State directories under :func:`root_dir`."""
    root = root_dir()
    if not root.is_dir():
        return []
    return [StateDir(p) for p in sorted(root.iterdir()) if p.is_dir()]
