"""A simulated cluster: one OS process per rank, joined by shared-memory mailboxes.

    from minidist.cluster import run
    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(4.0), dst=1)
        else:
            return comm.recv(src=0)
    results = run(fn, 2)          # [None, array([0., 1., 2., 3.])]

launcher.py starts the processes and handles failures (process_setup.py prepares each one), comm.py is
the Communicator, mailbox.py the shared-memory transport under it (the block's layout, waiting and
doorbells) and messages.py how one message streams through a mailbox; ledger.py holds the byte counters,
the simulated alpha-beta clock and traces.
"""

from .comm import Communicator, MessageMismatchError
from .launcher import ClusterError, run, run_traced
from .ledger import Device, LinkModel, Span, Stats, Trace, plot_timeline
from .mailbox import DeadlockError, PeerReturnedError

__all__ = ["ClusterError", "Communicator", "DeadlockError", "Device", "LinkModel", "MessageMismatchError",
           "PeerReturnedError", "Span", "Stats", "Trace", "plot_timeline", "run", "run_traced"]
