"""A minimal PMI-1 process manager, so that processes started by ``torchrun`` can form one MPI world.

MPICH learns its rank, its peers' addresses and the node layout from a process manager over the
PMI-1 wire protocol (``cmd=... key=value`` lines on the socket named by ``PMI_FD``). ``mpiexec``
(Hydra) normally runs it; under ``torchrun`` rank 0 starts this script instead (by file path, with
the standard library only, so it starts in milliseconds) and the ranks find it through torch's
store. It serves the key-value space, barriers and the node map, and exits once every rank has
finalized or gone.

    python pmi_server.py --size N [--mapping "(vector,(0,1,N))"] [--host 127.0.0.1] [--timeout S]

prints ``port=<port>`` on stdout once it listens.
"""
from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    """Serve ``--size`` ranks until all of them finalize or disconnect."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, required=True)
    p.add_argument("--mapping", default="", help="PMI_process_mapping value ('' = not offered)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for every rank to connect")
    args = p.parse_args(argv)
    server = socket.create_server((args.host, 0), backlog=args.size)
    print(f"port={server.getsockname()[1]}", flush=True)
    manager = Manager(args.size, args.mapping)
    server.settimeout(args.timeout)
    threads = []
    try:
        for _ in range(args.size):
            conn, _addr = server.accept()
            conn.settimeout(None)
            t = threading.Thread(target=manager.serve, args=(conn,), daemon=True)
            t.start()
            threads.append(t)
    except (socket.timeout, OSError) as exc:  # a rank never came: fail the others, don't hang
        print(f"pmi_server: only {len(threads)} of {args.size} ranks connected ({exc})",
              file=sys.stderr)
        manager.fail()
        return 1
    finally:
        server.close()
    for t in threads:
        t.join()
    return 0 if manager.clean else 1


class Manager:
    """Shared state of one job: the key-value space and the barrier."""

    def __init__(self, size: int, mapping: str) -> None:
        self.size = size
        # unique per job, as Hydra's are: MPICH derives its world id from the name and names the
        # node's shared-memory segment after it (/dev/shm/mpich_shm_<id>_<node>), so two jobs with
        # one name, at once or after a crashed job left its segment, would share one segment
        self.kvs_name = f"topocoll_kvs_{os.getpid()}_{secrets.token_hex(6)}"
        self.kvs: dict[str, str] = {"PMI_process_mapping": mapping} if mapping else {}
        self.lock = threading.Lock()
        self.waiting: list[socket.socket] = []
        self.conns: list[socket.socket] = []
        self.clean = True

    def serve(self, conn: socket.socket) -> None:
        """Answer one rank's requests until it finalizes; a rank that vanishes fails the job."""
        with self.lock:
            self.conns.append(conn)
            failed = not self.clean
        if failed:  # the job already failed: a late rank must not wait in a barrier forever
            _close(conn)
            return
        reader = conn.makefile("rb")
        for raw in reader:
            fields = _parse(raw.decode(errors="replace"))
            cmd = fields.get("cmd", "")
            if cmd == "finalize":
                _send(conn, "cmd=finalize_ack rc=0")
                return
            if cmd == "abort":
                break
            if cmd == "barrier_in":
                self._barrier(conn)
                continue
            _send(conn, self._answer(cmd, fields))
        self.fail()  # EOF or abort before finalize: peers blocked in a barrier must not wait forever

    def fail(self) -> None:
        """Close every connection: ranks still in MPI_Init see an error instead of a hang."""
        with self.lock:
            self.clean = False
            for c in self.conns:
                _close(c)

    def _answer(self, cmd: str, f: dict[str, str]) -> str:
        if cmd == "init":
            return "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"
        if cmd == "get_maxes":
            return "cmd=maxes kvsname_max=256 keylen_max=256 vallen_max=1024 rc=0"
        if cmd == "get_appnum":
            return "cmd=appnum appnum=0 rc=0"
        if cmd == "get_my_kvsname":
            return f"cmd=my_kvsname kvsname={self.kvs_name} rc=0"
        if cmd == "get_universe_size":
            return f"cmd=universe_size size={self.size} rc=0"
        if cmd == "put":
            with self.lock:
                self.kvs[f.get("key", "")] = f.get("value", "")
            return "cmd=put_result rc=0"
        if cmd == "get":
            with self.lock:
                value = self.kvs.get(f.get("key", ""))
            if value is None:
                return "cmd=get_result rc=-1 msg=key_not_found"
            return f"cmd=get_result rc=0 value={value}"
        return f"cmd={cmd}_result rc=-1 msg=unsupported_by_topocoll_pmi_server"

    def _barrier(self, conn: socket.socket) -> None:
        with self.lock:
            self.waiting.append(conn)
            if len(self.waiting) < self.size:
                return
            released, self.waiting = self.waiting, []
        for c in released:
            _send(c, "cmd=barrier_out rc=0")


def _parse(line: str) -> dict[str, str]:
    fields = {}
    for token in line.split():
        key, _, value = token.partition("=")
        fields[key] = value
    return fields


def _close(conn: socket.socket) -> None:
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _send(conn: socket.socket, line: str) -> None:
    try:
        conn.sendall(line.encode() + b"\n")
    except OSError:
        pass  # the rank is gone; its reader sees EOF and fails the job


if __name__ == "__main__":
    sys.exit(main())
