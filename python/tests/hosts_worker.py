"""One rank of the across-hosts test (test_hosts.py), under

    mpirun -np 4 --mca btl tcp,self python3 hosts_worker.py OUT_DIR
    python3 hosts_worker.py torch PORT      (the torch.distributed refusal, 2 gloo processes)

4 processes as 2 forced hosts of 2 (ranks_per_host=2) with every MPI byte on TCP, as between
real hosts; or, with UBEP_TEST_HOSTS=H (test_vhosts.py), H virtual hosts of 2 ranks
(scripts/vhosts.sh: each its own network, /dev/shm and hostname) that ubep finds itself, without
ranks_per_host: the mpi4py communicator becomes the C++ make_mpi_group (shared memory within a host,
the relay over MPI between hosts). Runs the native API (both layouts, both algorithms, fp8) and
saves what it got for the parent to check against the NumPy reference; runs ubep.deep_ep's own
test pattern (normal and low-latency modes) with its checks; and the set-up checks that need
MPI running (a handle that does not convert, a rank that does not match, the one-host fallback
and the refusal of a build without MPI).
"""
import os
import sys

import numpy as np

import reference as ref
import ubep
import worker

RPH = 2  # ranks per host
# Virtual hosts (scripts/vhosts.sh): the hosts are found, not forced (ranks_per_host=0).
REAL_HOSTS = int(os.environ.get("UBEP_TEST_HOSTS", "0"))
FORCE = 0 if REAL_HOSTS else RPH

# (name, layout, algorithm, framework, dtype, hook): both layouts x both algorithms, bf16 and
# fp32, torch and NumPy, a split-phase call.
NATIVE = [("tp-ubep", "throughput", "ubep", "torch", "bf16", False),
          ("tp-bsp", "throughput", "bsp", "numpy", "fp32", False),
          ("ll-ubep", "latency", "ubep", "numpy", "bf16", False),
          ("ll-bsp", "latency", "bsp", "torch", "fp32", False),
          ("ll-ubep-hook", "latency", "ubep", "torch", "bf16", True)]
FP8 = [("fp8-ll-ubep", "latency", "ubep"), ("fp8-tp-bsp", "throughput", "bsp")]


def spec_of(dtype, seed, ranks=4):
    return ref.Spec(ranks=ranks, experts=2 * ranks, topk=3, dtype=dtype, seed=seed,
                    ranks_per_host=RPH)


def run_fp8(group, spec, layout, algorithm):
    """An fp8 Buffer: x (bf16) cast on send by the C++ codec; the expert outputs and combine in
    bf16. Per iteration: codes, scales (as uint8 / float32), recv_src, recv_count, y."""
    import torch
    buf = ubep.Buffer(group, hidden=spec.H, num_experts=spec.E, max_tokens_per_rank=spec.T,
                      max_topk=spec.K, dtype="fp8", algorithm=algorithm, timeout=30.0)
    rank, results = buf.rank, []
    for it in range(worker.ITERS):
        x, idx, w = ref.make_inputs(spec, rank, it)
        fx = worker.to_fw(x, "torch")
        fidx, fw = torch.from_numpy(idx), torch.from_numpy(w)
        got = {}
        r = buf.dispatch(fx, fidx, fw, layout=layout)
        codes, scales = r.recv_x, r.recv_x_scales
        got.update(recv_count=worker.to_np(r.recv_count))
        shape = (codes.shape[0], spec.H) if layout == "throughput" else tuple(codes.shape)
        out = ref.make_expert_output(spec, rank, it, shape)
        got.update(codes=worker.to_np(codes.view(torch.uint8)), scales=worker.to_np(scales),
                   recv_src=worker.to_np(r.recv_src))
        y = buf.combine(worker.to_fw(out, "torch"), r.handle)
        got.update(y=worker.to_np(y))
        results.append(got)
    return results


def check_setup_errors(comm):
    """Set-up refusals that are decided locally (no rank is left in a collective)."""
    def expect(fn, *words):
        try:
            fn()
        except ubep.InvalidArgument as e:
            for w in words:
                assert w in str(e), (w, str(e))
            return
        raise AssertionError(f"no InvalidArgument (expected {words})")

    rank, size = comm.Get_rank(), comm.Get_size()
    expect(lambda: ubep._ubep.make_mpi_group(987654, rank, size), "987654", "does not convert")
    expect(lambda: ubep._ubep.make_mpi_group(comm.py2f(), (rank + 1) % size, size),
           f"rank {rank} of {size} in ubep's MPI", "not the same MPI")
    expect(lambda: ubep.make_group(comm, ranks_per_host=-1), "ranks_per_host", "-1")


def check_without_mpi(comm, spec):
    """An extension built without MPI: one host still works (mpi4py's collectives as the
    bootstrap, bit-identical results); forced hosts are refused naming the build option."""
    saved = ubep._ubep.has_mpi
    ubep._ubep.has_mpi = False
    try:
        if REAL_HOSTS:  # real hosts, found by their names: refused, naming them
            try:
                ubep.make_group(comm)
                raise AssertionError("hosts without MPI were accepted")
            except ubep.InvalidArgument as e:
                msg = str(e)
                assert f"spans {REAL_HOSTS} hosts" in msg and "'vh1'" in msg, msg
                assert "UBEP_WITH_MPI=ON" in msg and "forced" not in msg, msg
            return None
        g = ubep.make_group(comm)
        assert g.kind == "processes" and g.num_hosts == 1, (g.kind, g.num_hosts)
        got = worker.run_rank(g, spec, "latency", "ubep", "numpy")
        try:
            ubep.make_group(comm, ranks_per_host=RPH)
            raise AssertionError("forced hosts without MPI were accepted")
        except ubep.InvalidArgument as e:
            msg = str(e)
            assert "spans 2 hosts" in msg and "ranks 0-1" in msg and "ranks 2-3" in msg, msg
            assert "UBEP_WITH_MPI=ON" in msg, msg
    finally:
        ubep._ubep.has_mpi = saved
    return got


def main():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    out = sys.argv[1]
    rank, size = comm.Get_rank(), comm.Get_size()
    hosts = REAL_HOSTS or 2
    assert size == hosts * RPH, f"run with mpirun -np {hosts * RPH}"
    check_setup_errors(comm)
    group = ubep.make_group(comm, ranks_per_host=FORCE)
    assert group.kind == "mpi" and group.num_hosts == hosts, (group.kind, group.num_hosts)
    assert [group.host_of(r) for r in range(size)] == [r // RPH for r in range(size)]
    for seed, (name, layout, algorithm, framework, dtype, hook) in enumerate(NATIVE):
        # The first config hands the communicator itself to ubep.Buffer.
        g = comm if seed == 0 else group
        kw = dict(ranks_per_host=FORCE) if seed == 0 else {}
        spec = spec_of(dtype, seed + 20, size)
        worker.save(os.path.join(out, name), rank,
                    worker.run_rank(g, spec, layout, algorithm, framework, hook=hook, **kw))
    for seed, (name, layout, algorithm) in enumerate(FP8):
        worker.save(os.path.join(out, name), rank,
                    run_fp8(group, spec_of("bf16", seed + 40, size), layout, algorithm))
    nompi = check_without_mpi(comm, ref.Spec(ranks=4, experts=8, topk=3, seed=50))
    if nompi is not None:
        worker.save(os.path.join(out, "nompi"), rank, nompi)
    # ubep.deep_ep across the hosts: DeepEP's test pattern and checks (deep_ep_worker.py), its
    # combine model adding per-host partials; 4 experts per rank (16 on 4 ranks, as DeepEP's).
    import deep_ep_worker as dw
    dw.RANKS_PER_HOST = RPH
    dw.EXPERTS = 4 * size
    dw.run(group, dw.Comm(comm), rank, size, "ubep")
    comm.Barrier()
    print(f"rank {rank}: hosts OK", flush=True)


def _torch_rank(rank, port):
    """A gloo group on this machine with forced hosts of 1 rank: refused at set-up on every
    rank, naming the hosts and mpirun + mpi4py, and the torch group stays usable."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    for make in (lambda: ubep.make_group(ranks_per_host=1),
                 lambda: ubep.Buffer(dist.group.WORLD, hidden=8, num_experts=2,
                                     ranks_per_host=1)):
        try:
            make()
            raise AssertionError("a torch group spanning 2 hosts was accepted")
        except ubep.InvalidArgument as e:
            msg = str(e)
            for want in ("torch.distributed group spans 2 hosts", "host 0 '", ": ranks 0;",
                         "host 1 '", ": ranks 1", "ranks_per_host=1", "mpirun", "mpi4py",
                         "MPI.COMM_WORLD"):
                assert want in msg, (want, msg)
    one = ubep.make_group(ranks_per_host=2)  # both ranks on one forced host: accepted
    assert one.num_hosts == 1 and one.kind == "processes"
    dist.barrier()
    print(f"rank {rank}: torch refusal OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "torch":  # hosts_worker.py torch PORT (spawns 2 gloo processes)
        import torch.multiprocessing as mp
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        mp.spawn(_torch_rank, args=(int(sys.argv[2]),), nprocs=2)
    else:
        main()
