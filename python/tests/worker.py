"""One rank's part of the end-to-end tests, shared by thread ranks, torch.multiprocessing and
mpirun: runs a few dispatch/combine calls through the public ubep API and returns what it got
as NumPy arrays (bf16 as uint16 bits) for the parent to compare with the reference.

    python3 worker.py torch OUT_DIR PORT                                    (2 processes, gloo)
    mpirun -np 2 python3 worker.py mpi OUT LAYOUT ALGO FRAMEWORK DTYPE      (mpi4py)
"""
import sys

import numpy as np

import reference as ref
import ubep

ITERS = 3  # more than 2: both halves of the double-buffered window, and reuse of the first


def to_fw(a, framework, dtype=None, device=None):
    """NumPy data as the framework's array; torch tensors on ``device`` (a CUDA device) if
    given."""
    if framework == "numpy":
        return a
    import torch
    if a.dtype == np.uint16:  # bf16 bits
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    else:
        t = torch.from_numpy(a.copy())
    return t.to(device) if device is not None else t


def to_np(a):
    """Copy of a result (torch or NumPy) as NumPy, bf16 as uint16 bits."""
    if isinstance(a, np.ndarray):
        return a.copy()
    import torch
    a = a.detach().cpu()  # CUDA results come to the host; CPU tensors stay where they are
    if a.dtype == torch.bfloat16:
        return a.view(torch.int16).numpy().view(np.uint16).copy()
    return a.numpy().copy()


def run_rank(group, spec, layout, algorithm, framework, hook=False, zero_copy=True,
             weights_at_combine=False, placement="compact", device="cpu", ranks_per_host=0):
    """Returns a list over iterations of dicts of NumPy arrays. ``device``: the Buffer's; for
    "cuda[:N]" the torch inputs are made on that GPU (cuda-sim takes host arrays).
    ``ranks_per_host``: forced hosts when the Buffer makes the group (from an mpi4py comm)."""
    buf = ubep.Buffer(group, hidden=spec.H, num_experts=spec.E, max_tokens_per_rank=spec.T,
                      max_topk=spec.K, dtype=spec.dtype, algorithm=algorithm, timeout=30.0,
                      placement=placement, device=device, ranks_per_host=ranks_per_host)
    if ranks_per_host:
        assert buf.group.num_hosts == -(-buf.num_ranks // ranks_per_host), buf.group.num_hosts
    gpu = buf.device if buf.device.startswith("cuda:") else None
    rank = buf.rank
    results = []
    for it in range(ITERS):
        x, idx, w = ref.make_inputs(spec, rank, it)
        fx, fidx, fw = (to_fw(x, framework, device=gpu), to_fw(idx, framework, device=gpu),
                        to_fw(w, framework, device=gpu))
        got = {}
        if layout == "throughput":
            r = buf.dispatch(fx, fidx, fw)
            recv_x = r.recv_x
            got.update(recv_x=to_np(recv_x), recv_topk_idx=to_np(r.recv_topk_idx),
                       recv_topk_weights=to_np(r.recv_topk_weights), recv_src=to_np(r.recv_src),
                       recv_count=to_np(r.recv_count))
            out = ref.make_expert_output(spec, rank, it, (recv_x.shape[0], spec.H))
            y = buf.combine(to_fw(out, framework, device=gpu), r.handle)
        else:
            weights = None if weights_at_combine else fw
            split = hook and algorithm == "ubep"  # the split phase is the ubep algorithm's
            if split:
                buf.dispatch_send(fx, fidx, weights, layout="latency")
                r = buf.dispatch_recv()
            else:
                r = buf.dispatch(fx, fidx, weights, layout="latency")
            recv_x, h = r.recv_x, r.handle
            got.update(recv_x=to_np(recv_x), recv_count=to_np(r.recv_count),
                       recv_src=to_np(r.recv_src))
            out = ref.make_expert_output(spec, rank, it, tuple(recv_x.shape))
            if zero_copy:
                x_in = buf.combine_buffer(h)
                x_in[...] = to_fw(out, framework, device=gpu)
            else:
                x_in = to_fw(out, framework, device=gpu)
            at_combine = fw if weights_at_combine else None  # else the dispatch's
            if split:
                buf.combine_send(x_in, h, at_combine)
                y = buf.combine_recv()
            else:
                y = buf.combine(x_in, h, at_combine)
        got["y"] = to_np(y)
        got["barriers"] = np.int64(buf.last_stats()["barriers"])
        results.append(got)
    return results


def expected(spec, layout, placement="compact"):
    """The reference's answers: per iteration, per rank, a dict like run_rank's."""
    per_iter = []
    for it in range(ITERS):
        inputs = [ref.make_inputs(spec, r, it) for r in range(spec.R)]
        xs, idxs, ws = zip(*inputs)
        if layout == "throughput":
            disp = ref.dispatch_throughput(spec, xs, idxs, ws)
            outs = [ref.make_expert_output(spec, d, it, (disp[d]["recv_x"].shape[0], spec.H))
                    for d in range(spec.R)]
            ys = ref.combine_throughput(spec, disp, outs, [x.shape[0] for x in xs])
        else:
            disp, where = ref.dispatch_latency(spec, xs, idxs, placement)
            outs = [ref.make_expert_output(spec, d, it, disp[d]["recv_x"].shape)
                    for d in range(spec.R)]
            ys = ref.combine_latency(spec, where, outs, idxs, ws)
        per_iter.append([dict(disp[r], y=ys[r]) for r in range(spec.R)])
    return per_iter


def check(spec, layout, got_per_rank, placement="compact"):
    """Asserts bit equality of every rank's results with the reference."""
    want = expected(spec, layout, placement)
    for it in range(ITERS):
        for r in range(spec.R):
            got, exp = got_per_rank[r][it], want[it][r]
            for key in exp:
                if key == "valid":
                    continue
                g, e = got[key], exp[key]
                if layout == "latency" and key in ("recv_x", "recv_src"):
                    # Only the received rows of each expert are defined.
                    v = exp["valid"]
                    np.testing.assert_array_equal(g[v], e[v], err_msg=f"{key} it {it} rank {r}")
                    continue
                assert g.dtype == e.dtype, (key, g.dtype, e.dtype)
                np.testing.assert_array_equal(g, e, err_msg=f"{key} it {it} rank {r}")


CONFIGS = [("throughput", "ubep", False), ("throughput", "bsp", False),
           ("latency", "ubep", False), ("latency", "bsp", False), ("latency", "ubep", True)]


def save(path, rank, results):
    flat = {f"{it}_{k}": v for it, d in enumerate(results) for k, v in d.items()}
    np.savez(f"{path}.{rank}.npz", **flat)


def load(path, ranks):
    """The results save() wrote, per rank, as run_rank returns them."""
    out = []
    for r in range(ranks):
        with np.load(f"{path}.{r}.npz") as z:
            per_it = [{} for _ in range(ITERS)]
            for key in z.files:
                it, name = key.split("_", 1)
                per_it[int(it)][name] = z[key]
            out.append(per_it)
    return out


def _torch_rank(rank, out_dir, port):
    """One process of the torch.multiprocessing run: gloo for set-up, ubep for the data."""
    import os
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one host: never depend on DNS
    dist.init_process_group("gloo", rank=rank, world_size=2)
    spec = ref.Spec(ranks=2, dtype="bf16")
    group = ubep.make_group()  # the default group; the first config passes the ProcessGroup
    for n, (layout, algorithm, hook) in enumerate(CONFIGS):
        g = dist.group.WORLD if n == 0 else group
        save(f"{out_dir}/{layout}-{algorithm}-{hook}", rank,
             run_rank(g, spec, layout, algorithm, "torch", hook=hook))
    dist.destroy_process_group()


def _main():
    if sys.argv[1] == "torch":  # worker.py torch OUT_DIR PORT
        import torch.multiprocessing as mp
        mp.spawn(_torch_rank, args=(sys.argv[2], int(sys.argv[3])), nprocs=2)
        return
    # worker.py mpi OUT LAYOUT ALGO FRAMEWORK DTYPE, under mpirun
    out_path, layout, algorithm, framework, dtype = sys.argv[2:7]
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    spec = ref.Spec(ranks=comm.Get_size(), dtype=dtype)
    save(out_path, comm.Get_rank(), run_rank(comm, spec, layout, algorithm, framework))


if __name__ == "__main__":
    _main()
