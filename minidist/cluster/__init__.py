"""A simulated cluster: one OS process per rank, joined by shared-memory mailboxes.

    from minidist.cluster import run
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(4.0), dst=1)
        else:
            return comm.recv(src=0)
    results = run(fn, 2)          # [None, array([0., 1., 2., 3.])]

launcher.py starts the processes and handles failures (process_setup.py prepares each one). Each rank
talks through a Communicator, and each layer calls only the one below it:

    comm.py       the Communicator: send, recv, sendrecv, collective (group.py: barrier, all_equal, split)
    messages.py   one message through a mailbox: reserve slots, copy in, ring / wait, copy out, free
    mailbox.py    the shared-memory mailboxes, waiting and doorbells (layout.py: where everything sits)

header.py packs a message's header, checks.py checks arguments, ledger.py holds the byte counters, the
simulated alpha-beta clock and traces; topology.py describes a two-level cluster (nodes × ranks per node).
Under ``mpiexec`` the same ``run`` uses MPI processes instead (backend.py, mpi_backend.py, mpi_comm.py;
README "Run on a real cluster").
"""


from .backend import run, run_traced  # launcher.py's, or MPI's under mpiexec (mpi_backend.py)
from .comm import Communicator, MessageMismatchError
from .launcher import ClusterError
from .ledger import Device, LinkModel, Span, Stats, Trace
from .mailbox import DeadlockError, PeerReturnedError
from .topology import Topology

__all__ = ["ClusterError", "Communicator", "DeadlockError", "Device", "LinkModel", "MessageMismatchError",
           "PeerReturnedError", "Span", "Stats", "Topology", "Trace", "run", "run_traced"]
