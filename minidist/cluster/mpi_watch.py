"""The launcher's watch over an MPI job: which rank died without Python's help (a signal, ``os._exit``).

Such a death prints nothing, and MPICH's mpiexec names no rank (for a signal it prints a PID). So
``launch`` (mpi_launch.py) listens on a Unix socket whose path it passes as MINIDIST_MPI_WATCH; every
process of the job connects when it imports minidist.cluster and sends "<rank> <pid>", and before Python
ends it, "exit" or "reported" (cluster/mpi_rank.py). The first connection that closes without either is the
process that died silently — unless some process had already reported a failure: then the others were
ended by MPI_Abort, and the printed report says what happened.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import tempfile
import threading
from pathlib import Path


class RankWatch:
    """Listen to the job's processes from a thread; ``close()`` after the job, then ``silent_death()``."""

    def __init__(self):
        self.folder = tempfile.mkdtemp(prefix="minidist-mpi-")
        self.path = str(Path(self.folder) / "watch")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.wake_read, self.wake_write = os.pipe()
        self.reported, self.dead = False, None       # dead: (rank, pid) of the first silent death
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        chosen = selectors.DefaultSelector()
        chosen.register(self.listener, selectors.EVENT_READ)
        chosen.register(self.wake_read, selectors.EVENT_READ)
        said: dict[socket.socket, list[str]] = {}      # connection -> the lines it sent
        stop = False
        while not stop:
            ended = []
            for key, _ in chosen.select():              # (blocks until something happens: no polling)
                if key.fileobj is self.listener:
                    connection, _ = self.listener.accept()
                    chosen.register(connection, selectors.EVENT_READ)
                    said[connection] = [""]
                elif key.fileobj == self.wake_read:
                    stop = True
                else:
                    data = key.fileobj.recv(4096)
                    if data:
                        lines = (said[key.fileobj].pop() + data.decode(errors="replace")).split("\n")
                        said[key.fileobj] += lines
                        self.reported |= "reported" in lines
                    else:
                        ended.append(key.fileobj)
            for connection in ended:                     # data first (above), then who ended silently
                chosen.unregister(connection)
                connection.close()
                lines = [line for line in said.pop(connection) if line]
                if (
                    lines
                    and not {"exit", "reported"} & set(lines)
                    and not self.reported
                    and self.dead is None
                ):
                    rank, _, pid = lines[0].partition(" ")
                    self.dead = (int(rank), int(pid))
        for connection in said:
            connection.close()
        chosen.close()

    def close(self) -> None:
        """After the job has ended: stop the thread and remove the socket."""
        os.write(self.wake_write, b"x")
        self.thread.join(timeout=5.0)
        for fd in (self.wake_read, self.wake_write):
            os.close(fd)
        self.listener.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def silent_death(self, returncode: int) -> str | None:
        """The report naming the rank that died without Python's help, or None."""
        if self.dead is None or returncode == 0:
            return None
        rank, pid = self.dead
        return (
            f"minidist (MPI backend): rank {rank} (pid {pid}) ended without a Python error: killed by a "
            f"signal or by os._exit (mpiexec's exit status {returncode}: that process's exit code, or the "
            f"number of the signal that killed it). The other processes were then ended by mpiexec."
        )
