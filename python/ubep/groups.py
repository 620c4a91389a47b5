"""Groups of ranks: threads of this process, or processes (torch.distributed, mpi4py).

An mpi4py communicator becomes the C++ ``make_mpi_group`` on that communicator (when the
extension is built with MPI): hosts found by MPI_COMM_TYPE_SHARED, shared memory within a host,
the relay over MPI between hosts. A torch.distributed group becomes a one-host group whose
*bootstrap* is the framework's collectives (gloo's all_gather_object): they carry the
shared-memory segment names once, when the group and each Buffer are made; a torch group that
spans hosts is refused (it has no transport between hosts). The data path is ubep's own: stores
into the peers' shared memory (and MPI between hosts), no framework call. ``make_tcp_group`` is
the C++ ``make_tcp_group``: one launcher per host, TCP between hosts, no MPI job, so survivors
outlive a lost host (docs/ELASTIC.md).
"""
import os
import socket
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


def _ranges(ranks):
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def _hosts(boot, ranks_per_host):
    """(host id of every rank, host names): forced by ranks_per_host > 0 (every that many
    consecutive ranks form a host, as GroupOptions::ranks_per_host), else by host name. One
    allgather over the bootstrap (collective)."""
    name = socket.gethostname().encode()[:255]
    raw = boot.allgather(name.ljust(256, b"\0"))
    names = [raw[i * 256:(i + 1) * 256].rstrip(b"\0").decode(errors="replace")
             for i in range(boot.size())]
    if ranks_per_host > 0:
        return [r // ranks_per_host for r in range(len(names))], names
    ids = {}
    return [ids.setdefault(n, len(ids)) for n in names], names


def _refuse_multi_host(boot, ranks_per_host, what, way_on):
    """Raises InvalidArgument on every rank (they all see the same host map, so none is left
    waiting) when the ranks of ``boot`` span hosts: a bootstrap group is one host's shared
    memory."""
    hosts, names = _hosts(boot, ranks_per_host)
    n = max(hosts) + 1 if hosts else 1
    if n <= 1:
        return
    parts = []
    for h in range(n):
        ranks = [r for r, x in enumerate(hosts) if x == h]
        parts.append(f"host {h} '{names[ranks[0]]}': ranks {_ranges(ranks)}")
    forced = f", forced by ranks_per_host={ranks_per_host}" if ranks_per_host > 0 else ""
    raise _ubep.InvalidArgument(
        f"make_group: the {what} spans {n} hosts ({'; '.join(parts)}{forced}), but {way_on}")


_TORCH_WAY_ON = (
    "a group made from torch.distributed is one host's shared memory, with no transport "
    "between hosts. Across hosts, launch with mpirun and pass an mpi4py communicator: "
    "ubep.make_group(MPI.COMM_WORLD) or ubep.Buffer(MPI.COMM_WORLD, ...) (ubep's MPI group: "
    "shared memory within each host, the relay over MPI between hosts; docs/PYTHON.md, "
    "\"Across hosts\")")

_NO_MPI_WAY_ON = (
    "this build of ubep's extension has no MPI (built with UBEP_WITH_MPI=OFF, or no MPI was "
    "found), so it can only run one host's shared memory. Install MPI's headers (Debian: "
    "libopenmpi-dev, the MPI mpi4py uses; scripts/deps.sh) and rebuild with "
    "cmake -DUBEP_WITH_MPI=ON")


def check_same_mpi(mpi4py_version, ubep_version):
    """Raises InvalidArgument naming both when mpi4py's MPI (MPI.Get_library_version()) is not
    the one the extension was built with (MPI_Get_library_version): a communicator of one MPI
    means nothing to another, and two MPI libraries in one process do not talk to each other."""
    a, b = " ".join(str(mpi4py_version).split()), " ".join(str(ubep_version).split())
    if a != b:
        raise _ubep.InvalidArgument(
            f"make_group: mpi4py and ubep use different MPI libraries: mpi4py's is '{a}', "
            f"ubep's extension was built with '{b}'. Use one MPI for both: mpi4py built for "
            f"ubep's MPI (Debian: python3-mpi4py with libopenmpi-dev), or ubep rebuilt against "
            f"mpi4py's (cmake -DMPI_HOME=... -DUBEP_WITH_MPI=ON)")


def _mpi_group(comm, timeout, ranks_per_host, elastic_name=""):
    """The C++ make_mpi_group on an mpi4py communicator, after checking that both sides are one
    MPI. The communicator crosses as its Fortran handle (comm.py2f(), MPI_Comm_f2c in C++): an
    integer in every MPI, where the C handle is a pointer in Open MPI and an int in MPICH
    (python/src/mpi.cpp)."""
    from mpi4py import MPI
    check_same_mpi(MPI.Get_library_version(), _ubep.mpi_library_version())
    if not MPI.Is_initialized() or MPI.Is_finalized():
        raise _ubep.InvalidArgument(
            f"make_group: MPI is {'finalized' if MPI.Is_finalized() else 'not initialised'} "
            f"(mpi4py.rc.initialize=False? call MPI.Init_thread() before making the group)")
    return _ubep.make_mpi_group(int(comm.py2f()), comm.Get_rank(), comm.Get_size(),
                                float(timeout), int(ranks_per_host), str(elastic_name))


def make_group(group=None, *, timeout=60.0, ranks_per_host=0, elastic_name=""):
    """A ``ubep.Group`` of processes (collective over their ranks).

    ``group``: an mpi4py communicator -- the C++ ``make_mpi_group`` on it: hosts found by MPI
    (MPI_COMM_TYPE_SHARED), shared memory within a host, the relay over MPI between hosts; the
    way to run across hosts. Or a torch.distributed process group (None: the default group,
    which must be initialised): one host's shared memory, set up over the group's collectives;
    if its ranks span hosts, InvalidArgument names them and the way on (mpirun + mpi4py).

    ``ranks_per_host`` > 0 forces every that many consecutive ranks to count as one host
    (``GroupOptions::ranks_per_host``): with an mpi4py communicator it runs the cross-host relay
    on one machine (over MPI, e.g. TCP with ``mpirun --mca btl tcp,self``); with a torch group it
    shows the refusal.

    ``elastic_name`` (elastic EP, docs/ELASTIC.md; one host): a name for the group on this host
    (``GroupOptions::elastic_name``; 1..39 characters, no '/'; unique among the live groups of
    the host), under which a process that replaces a dead rank joins it with
    ``ubep.make_rejoin_group(elastic_name, rank)``. Empty (default): no rejoin."""
    rph = int(ranks_per_host)
    elastic_name = str(elastic_name or "")
    if rph < 0:
        raise _ubep.InvalidArgument(
            f"make_group: ranks_per_host must be >= 0, got {ranks_per_host}")
    if group is None or _is_torch_group(group):
        if group is None:
            import torch.distributed as dist
            if not dist.is_initialized():
                raise _ubep.InvalidArgument(
                    "make_group: no group given and torch.distributed is not initialised "
                    "(call torch.distributed.init_process_group('gloo') first)")
        boot = TorchBootstrap(group)
        _refuse_multi_host(boot, rph, "torch.distributed group", _TORCH_WAY_ON)
    elif _is_mpi_comm(group):
        if getattr(_ubep, "has_mpi", False):
            return _mpi_group(group, timeout, rph, elastic_name)
        # One host still works without MPI in the extension: mpi4py's collectives as bootstrap.
        boot = MpiBootstrap(group)
        _refuse_multi_host(boot, rph, "mpi4py communicator", _NO_MPI_WAY_ON)
    else:
        raise _ubep.InvalidArgument(
            f"make_group: expected a torch.distributed ProcessGroup, an mpi4py communicator or a "
            f"ubep.Group, got {type(group).__module__}.{type(group).__name__}")
    if not hasattr(_ubep, "make_bootstrap_group"):
        raise _ubep.InvalidArgument("make_group: this build has no process-group support")
    return _ubep.make_bootstrap_group(boot, float(timeout), elastic_name)


def make_rejoin_group(elastic_name, rank, *, timeout=60.0):
    """A ``ubep.Group`` in which this new process takes the place of rank ``rank`` of the live
    process group made with ``elastic_name`` on this host (``make_group(...,
    elastic_name=...)`` or ``ubep.Buffer(..., elastic_name=...)``), after that rank's process
    died (the C++ ``make_rejoin_group``, docs/ELASTIC.md). Not collective and no framework
    group is needed: the live ranks notice the newcomer at their next dispatch and unmask it
    from an agreed call on. Then make the same Buffers on it, in the same order and
    with the same arguments, as the other ranks did (their windows are matched by order); their
    first dispatch rejoins. ``InvalidArgument`` when no group of that name is on this host or
    ``rank`` is out of its range."""
    if not hasattr(_ubep, "make_rejoin_group"):
        raise _ubep.InvalidArgument("make_rejoin_group: this build has no process-group support")
    return _ubep.make_rejoin_group(str(elastic_name), int(rank), float(timeout))


_TCP_ENV = (("rendezvous", "UBEP_RENDEZVOUS"), ("hosts", "UBEP_HOSTS"),
            ("host", "UBEP_HOST_INDEX"), ("ranks_per_host", "UBEP_RANKS_PER_HOST"),
            ("local_rank", "UBEP_LOCAL_RANK"))


def _env_flag(key, value, var):
    """``value`` as a bool; None: from ``var`` ("1" on, "0" or unset off, as the C++
    TcpLaunch::from_env reads it). Anything else is named."""
    if value is not None:
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        raise _ubep.InvalidArgument(f"make_tcp_group: {key} must be True or False, got {value!r}")
    raw = os.environ.get(var, "")
    if raw in ("", "0", "1"):
        return raw == "1"
    raise _ubep.InvalidArgument(
        f"make_tcp_group: {key} not given and {var}={raw!r} is neither 0 nor 1")


def make_tcp_group(rendezvous=None, *, hosts=None, host=None, ranks_per_host=None,
                   local_rank=None, timeout=60.0, elastic=None, rejoin=None):
    """A ``ubep.Group`` across hosts with one launcher per host and no MPI job spanning them (the
    C++ ``make_tcp_group``, docs/ELASTIC.md): ranks of one host share memory, ranks of different
    hosts talk over TCP sockets of their own, so the processes of the other hosts outlive a
    lost host. With ``ubep.Buffer(..., mask_dead_ranks=True)`` the survivors mask its ranks and
    go on; an MPI job (``make_group`` on an mpi4py communicator) cannot, as Open MPI ends the
    job when a host is lost.

    Collective over every rank of every host. ``rendezvous``: "IPv4:port" where host 0's local
    rank 0 listens; ``hosts``, ``host`` (this launcher's, 0..hosts-1), ``ranks_per_host``,
    ``local_rank`` (this process among its host's ranks). Each one left None is read from the
    environment a launcher sets: UBEP_RENDEZVOUS, UBEP_HOSTS, UBEP_HOST_INDEX,
    UBEP_RANKS_PER_HOST, UBEP_LOCAL_RANK (scripts/vhosts.sh launch sets all but the last).
    ``InvalidArgument`` names a missing or malformed one; ``TimeoutError`` when a rank does not
    arrive within ``timeout`` seconds.

    A replacement host (docs/ELASTIC.md, "A replacement host"): ``elastic=True`` on every rank
    of the live group (every host's local rank 0 then keeps a door open for replacements: host
    0's at the rendezvous, host h's at its address and the rendezvous' port + h; those ports stay
    taken while the group lives). After the survivors masked a lost host, that
    host's launcher runs again and its new ranks call ``make_tcp_group(rejoin=True)`` with the
    same launch (the same ``host``): not collective with the live ranks, which take them in at
    their next dispatch. Each new rank then makes the same Buffers, with the same arguments,
    and calls dispatch/combine as the live ranks do; the first dispatch agrees with them and
    serves. Host 0 too, once the others went on without it (3 hosts or more; its replacement
    finds the next live host's door from UBEP_HOST_IPS, or on loopback). None: from UBEP_ELASTIC / UBEP_REJOIN ("1" on, "0" or
    unset off), as the C++ ``TcpLaunch::from_env``."""
    given = dict(rendezvous=rendezvous, hosts=hosts, host=host, ranks_per_host=ranks_per_host,
                 local_rank=local_rank)
    args = {}
    for key, var in _TCP_ENV:
        value = given[key]
        if value is None:
            value = os.environ.get(var)
            if value is None or value == "":
                raise _ubep.InvalidArgument(
                    f"make_tcp_group: {key} not given and {var} is not set")
        if key == "rendezvous":
            args[key] = str(value)
            continue
        try:
            args[key] = int(value)
        except (TypeError, ValueError):
            raise _ubep.InvalidArgument(
                f"make_tcp_group: {key} must be an integer, got {value!r}"
                f"{' (from ' + var + ')' if given[key] is None else ''}") from None
    elastic = _env_flag("elastic", elastic, "UBEP_ELASTIC")
    rejoin = _env_flag("rejoin", rejoin, "UBEP_REJOIN")
    return _ubep.make_tcp_group(args["rendezvous"], args["hosts"], args["host"],
                                args["ranks_per_host"], args["local_rank"], float(timeout),
                                elastic, rejoin)


def as_group(group, *, timeout=60.0, ranks_per_host=0, elastic_name=""):
    """``group`` if it is a ``ubep.Group``, else make_group(group)."""
    if isinstance(group, _ubep.Group):
        if ranks_per_host:
            raise _ubep.InvalidArgument(
                f"ranks_per_host={ranks_per_host} applies when ubep makes the group, but {group!r} "
                f"is a ubep.Group already ({group.num_hosts} hosts): pass it to make_group's "
                f"group instead, or make the Group with ranks_per_host")
        if elastic_name:
            raise _ubep.InvalidArgument(
                f"elastic_name='{elastic_name}' applies when ubep makes the group, but {group!r} "
                f"is a ubep.Group already: pass elastic_name to ubep.make_group instead")
        return group
    return make_group(group, timeout=timeout, ranks_per_host=ranks_per_host,
                      elastic_name=elastic_name)
