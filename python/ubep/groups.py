"""Groups of ranks: threads of this process, or processes (torch.distributed, mpi4py).

Processes on one host find each other through a *bootstrap*: the framework's collectives
(gloo's all_gather_object, mpi4py's allgather) carry the shared-memory segment names and host
names once, when the group and each Buffer are made. The data path is ubep's own: stores into
the peers' shared memory, no framework call.
"""
import threading

from . import _ubep


def run_on_threads(ranks, fn, *, timeout=60.0, ranks_per_host=0):
    """Runs ``fn(group)`` on ``ranks`` threads, one ``ubep.Group`` each, and returns their
    results in rank order. The threads run C++ without the GIL, so ranks progress in parallel.
    After every thread has finished, re-raises the earliest error a rank raised, preferring any
    other error over a ``ubep.TimeoutError`` (usually the echo of a peer that failed first).
    Ctrl-C ends the ranks' waits and raises KeyboardInterrupt here.

    ``ranks_per_host`` > 0 pretends every that many ranks form a host (tests the cross-host
    relay on one machine)."""
    world = _ubep.ThreadWorld(int(ranks), float(timeout), int(ranks_per_host))
    groups = [world.group(r) for r in range(ranks)]
    results = [None] * ranks
    failures = []  # (rank, exception), in the order they happened
    lock = threading.Lock()

    def body(r):
        try:
            results[r] = fn(groups[r])
        except BaseException as e:  # noqa: B902 - reported to the caller below
            with lock:
                failures.append((r, e))

    threads = [threading.Thread(target=body, args=(r,), name=f"ubep-rank-{r}", daemon=True)
               for r in range(ranks)]
    _ubep._install_interrupt_hook()
    _ubep._clear_interrupt()
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        # Our SIGINT handler also set the flag the waits poll: they end with an Error soon.
        for t in threads:
            t.join()
        _ubep._clear_interrupt()
        raise
    if failures:
        first = next((f for f in failures if not isinstance(f[1], _ubep.TimeoutError)),
                     failures[0])
        rank, err = first
        if hasattr(err, "add_note"):  # Python >= 3.11
            err.add_note(f"(raised by thread rank {rank} of {ranks})")
        raise err
    return results


class _PyBootstrap:
    """What the C++ bootstrap calls back into: rank, size, allgather(bytes) -> bytes, barrier."""

    def rank(self):
        raise NotImplementedError

    def size(self):
        raise NotImplementedError

    def allgather(self, data):
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError


class TorchBootstrap(_PyBootstrap):
    """torch.distributed process group (gloo; any backend whose all_gather_object works)."""

    def __init__(self, pg=None):
        import torch.distributed as dist
        self._dist = dist
        self._pg = pg

    def rank(self):
        return self._dist.get_rank(self._pg)

    def size(self):
        return self._dist.get_world_size(self._pg)

    def allgather(self, data):
        out = [None] * self.size()
        self._dist.all_gather_object(out, bytes(data), group=self._pg)
        return b"".join(out)

    def barrier(self):
        self._dist.barrier(group=self._pg)


class MpiBootstrap(_PyBootstrap):
    """mpi4py communicator (under mpirun)."""

    def __init__(self, comm):
        self._comm = comm

    def rank(self):
        return self._comm.Get_rank()

    def size(self):
        return self._comm.Get_size()

    def allgather(self, data):
        return b"".join(self._comm.allgather(bytes(data)))

    def barrier(self):
        self._comm.Barrier()


def _is_torch_group(obj):
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, dist.ProcessGroup) or (obj is dist.group.WORLD)


def _is_mpi_comm(obj):
    return type(obj).__module__.startswith("mpi4py") and hasattr(obj, "allgather")


def make_group(group=None, *, timeout=60.0):
    """A ``ubep.Group`` over processes on one host: ``group`` is a torch.distributed process
    group (None: the default group, which must be initialised) or an mpi4py communicator.
    Collective over its ranks."""
    if group is None or _is_torch_group(group):
        if group is None:
            import torch.distributed as dist
            if not dist.is_initialized():
                raise _ubep.InvalidArgument(
                    "make_group: no group given and torch.distributed is not initialised "
                    "(call torch.distributed.init_process_group('gloo') first)")
        boot = TorchBootstrap(group)
    elif _is_mpi_comm(group):
        boot = MpiBootstrap(group)
    else:
        raise _ubep.InvalidArgument(
            f"make_group: expected a torch.distributed ProcessGroup, an mpi4py communicator or a "
            f"ubep.Group, got {type(group).__module__}.{type(group).__name__}")
    if not hasattr(_ubep, "make_bootstrap_group"):
        raise _ubep.InvalidArgument("make_group: this build has no process-group support")
    return _ubep.make_bootstrap_group(boot, float(timeout))


def as_group(group, *, timeout=60.0):
    """``group`` if it is a ``ubep.Group``, else make_group(group)."""
    if isinstance(group, _ubep.Group):
        return group
    return make_group(group, timeout=timeout)
