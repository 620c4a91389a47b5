"""DeepEP's own test pattern (tests/legacy/test_low_latency.py and test_intranode.py), written
for ubep.deep_ep: every rank fills x with a rank-derived value and the token index in the last
128 channels, routes at random with some -1s, dispatches, and checks the counts against the
all-gathered routing, every source range, every row's value and token id, cached dispatch, and
combine against x * sum(weights) -- bit for bit against the models in fp8_reference.py and
below, plus DeepEP's own tolerance checks.

    python3 deep_ep_worker.py spawn RANKS ALGORITHM     (torch.multiprocessing.spawn + gloo)
    mpirun -np N python3 deep_ep_worker.py mpi ALGORITHM
"""
import os
import random
import sys

import numpy as np
import torch

import fp8_reference as f8
import ubep
import ubep.deep_ep as deep_ep

TOKENS, HIDDEN, EXPERTS, TOPK = 24, 512, 16, 4   # hidden % 512: UE8M0 packing
OFFSET = 128  # DeepEP's rank_offset: x = rank - 128 keeps every value exact in bf16


class Comm:
    """all_gather for the test's own bookkeeping (not ubep's data path)."""

    def __init__(self, mpi_comm=None):
        self.mpi = mpi_comm

    def gather(self, t):
        if self.mpi is not None:
            return torch.stack([torch.from_numpy(a) for a in self.mpi.allgather(t.numpy())])
        import torch.distributed as dist
        out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
        dist.all_gather(out, t)
        return torch.stack(out)


def calc_diff(x, y):  # DeepEP's similarity measure
    x, y = x.double() + 1, y.double() + 1
    return (1 - 2 * (x * y).sum() / (x * x + y * y).sum()).item()


def bf16(a):
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)


def f32(t):
    return t.to(torch.float32).numpy()


def u8(t):
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def make_x(rank, value):
    x = np.full((TOKENS, HIDDEN), value, dtype=np.float32)
    x[:, -128:] = np.arange(TOKENS, dtype=np.float32)[:, None]
    return x


def routing(rank, seed):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    scores = torch.rand((TOKENS, EXPERTS), generator=g) + 1
    idx = torch.topk(scores, TOPK, dim=-1).indices.to(deep_ep.topk_idx_t)
    rnd = random.Random(seed * 100 + rank)
    for _ in range(6):
        idx[rnd.randrange(TOKENS), rnd.randrange(TOPK)] = -1
    w = torch.rand((TOKENS, TOPK), generator=g) + 0.25
    return idx, w


RANKS_PER_HOST = 0  # > 0: the group has forced hosts of that many ranks (hosts_worker.py)


def weighted_sum(rows, w, dests=None):
    """ubep's combine: sum over k ascending of fl(w_k * row_k) in fp32, one bf16 rounding.
    Across hosts (RANKS_PER_HOST, ``dests``: the rank each row came from) each host's partial is
    summed from 0 and the partials added in ascending host order (docs/SEMANTICS.md)."""
    hosts = [d // RANKS_PER_HOST if RANKS_PER_HOST else 0 for d in (dests or [0] * len(rows))]
    acc = np.zeros(rows[0].shape, dtype=np.float32)
    for h in sorted(set(hosts)):
        part = np.zeros(rows[0].shape, dtype=np.float32)
        for k, row in enumerate(rows):
            if hosts[k] == h:
                part = (part + (np.float32(w[k]) * row).astype(np.float32)).astype(np.float32)
        acc = (acc + part).astype(np.float32)
    return f32(bf16(acc))


def check_low_latency(buf, comm, rank, R, seed):
    El = EXPERTS // R
    idx, w = routing(rank, seed)
    all_idx = comm.gather(idx)
    xs = {r: make_x(r, r - OFFSET) for r in range(R)}
    x = bf16(xs[rank])
    n = 0
    for hook in (False, True):
        for use_fp8, rs, ue in ((False, False, False), (True, False, False), (True, True, False),
                                (True, True, True)):
            n += 1
            for _ in range(n % 2 + 1):  # sometimes two dispatches before the combine
                stats = torch.zeros(El, dtype=torch.int32)
                recv, count, handle, event, h = buf.low_latency_dispatch(
                    x, idx, TOKENS, EXPERTS, cumulative_local_expert_recv_stats=stats,
                    use_fp8=use_fp8, round_scale=rs, use_ue8m0=ue, async_finish=not hook,
                    return_recv_hook=hook)
                h() if hook else event.current_stream_wait()
            assert count.dtype == torch.int32 and isinstance(handle, tuple) and len(handle) == 5
            assert handle[2:] == (TOKENS, HIDDEN, EXPERTS)
            if use_fp8:
                codes, scales = recv
                assert codes.shape == (El, TOKENS * R, HIDDEN)
                if ue:
                    assert scales.dtype == torch.int32 and scales.shape[-1] == HIDDEN // 512
                    scales = (scales.contiguous().view(torch.uint8).to(torch.int32) << 23).view(
                        torch.float32)
                gemm = f8.dequantize(u8(codes).numpy(), scales.numpy())
            else:
                assert recv.dtype == torch.bfloat16
                gemm = f32(recv)
            gemm = f32(bf16(gemm))  # the experts' bf16 output: the identity
            for i in range(El):
                e = rank * El + i
                num = int(count[i])
                assert stats[i].item() == num
                assert num == int((all_idx == e).sum()), (num, e)
                rng = handle[1][i]
                assert num == int((rng & 0xFFFFFFFF).sum())
                src_tok = handle[0][i, :num].numpy()
                for j in range(R):
                    begin, cnt = int(rng[j] >> 32), int(rng[j] & 0xFFFFFFFF)
                    toks = (all_idx[j] == e).any(dim=1).nonzero().view(-1).numpy()
                    assert cnt == len(toks)
                    assert (src_tok[begin:begin + cnt] == toks).all()   # token order
                    want = xs[j][toks]
                    if use_fp8:
                        qc, qs = f8.quantize(want, rs)
                        assert (u8(codes)[i, begin:begin + cnt].numpy() == qc).all()
                        if not ue:
                            assert (recv[1][i, begin:begin + cnt].numpy() == qs).all()
                        want = f8.dequantize(qc, qs)
                    assert (gemm[i, begin:begin + cnt] == f32(bf16(want))).all()
                    if not rs:  # DeepEP's checks: value j - 128 and the token id
                        got = gemm[i, begin:begin + cnt]
                        assert (got[:, :-128] == j - OFFSET).all()
                        assert (got[:, -128:] == toks[:, None]).all()
            sim = torch.from_numpy(gemm).to(torch.bfloat16)
            for zero_copy in (False, True):
                if zero_copy:
                    buf.get_next_low_latency_combine_buffer(handle)[:, :, :] = sim
                out = torch.empty((TOKENS, HIDDEN), dtype=torch.bfloat16)
                y, event, h = buf.low_latency_combine(sim, idx, w, handle, zero_copy=zero_copy,
                                                      async_finish=not hook,
                                                      return_recv_hook=hook, out=out)
                h() if hook else event.current_stream_wait()
                assert y is out
                xr = xs[rank]
                if use_fp8:
                    xr = f8.dequantize(*f8.quantize(xr, rs))
                xr = f32(bf16(xr))
                for t in range(TOKENS):
                    sel = [k for k in range(TOPK) if idx[t, k] >= 0]
                    ref = weighted_sum([xr[t]] * len(sel), w[t, sel].numpy(),
                                       [int(idx[t, k]) // El for k in sel])
                    assert (f32(y[t]) == ref).all(), (t, use_fp8, rs, zero_copy)
                wsum = w.masked_fill(idx == -1, 0).sum(dim=1, keepdim=True)
                diff = calc_diff(x.float() * wsum, y.float())
                assert rs or diff < (9e-4 if use_fp8 else 1e-5), diff
    return n


def check_normal(buf, comm, rank, R, seed):
    El = EXPERTS // R
    idx, _ = routing(rank, seed + 7)
    all_idx = comm.gather(idx)
    xs = {r: make_x(r, r) for r in range(R)}
    x = bf16(xs[rank])
    rand = torch.randn((TOKENS, HIDDEN)).to(torch.bfloat16)
    codes, scales = f8.quantize(xs[rank])
    x_e4m3 = (torch.from_numpy(codes), torch.from_numpy(scales).T.contiguous().T)
    if hasattr(torch, "float8_e4m3fn"):
        x_e4m3 = (x_e4m3[0].view(torch.float8_e4m3fn), x_e4m3[1])
    w_rank = torch.ones((TOKENS, TOPK)) * rank
    w_rand = torch.randn((TOKENS, TOPK))
    per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, EXPERTS)
    my_in_rank = torch.zeros((TOKENS, R), dtype=torch.bool)
    for r in range(R):
        my_in_rank[:, r] = ((idx // El == r) & (idx >= 0)).any(dim=1)
    assert torch.equal(in_rank, my_in_rank)
    assert per_rank.tolist() == my_in_rank.sum(0).tolist()
    assert per_expert.tolist() == [int((idx == e).sum()) for e in range(EXPERTS)]
    srcs = [((all_idx[j] // El == rank) & (all_idx[j] >= 0)).any(dim=1).nonzero().view(-1)
            for j in range(R)]
    n_dest = my_in_rank.sum(1).view(-1, 1).float()
    for current in (rand, x, x_e4m3):
        for with_topk in (False, True):
            args = dict(x=current, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank,
                        num_tokens_per_expert=per_expert, config=deep_ep.Config(20, 8, 256),
                        async_finish=True, previous_event=buf.capture())
            wt = w_rand if current is rand else w_rank
            if with_topk:
                args.update(topk_idx=idx, topk_weights=wt)
            recv, r_idx, r_w, counts, handle, event = buf.dispatch(**args)
            event.current_stream_wait()
            fp8 = isinstance(current, tuple)
            rows = sum(len(s) for s in srcs)
            vals = f8.dequantize(u8(recv[0]).numpy(), recv[1].numpy()) if fp8 else f32(recv)
            assert vals.shape == (rows, HIDDEN)
            assert counts == [int((all_idx == rank * El + i).sum()) for i in range(El)]
            rpm, src_idx = handle[0], handle[3]
            begin = 0
            for j in range(R):
                end = int(rpm[j][rank])
                assert end - begin == len(srcs[j])
                assert (src_idx[begin:end] == srcs[j].to(torch.int32)).all()
                if current is not rand:
                    want = xs[j][srcs[j].numpy()]
                    if fp8:
                        qc, qs = f8.quantize(want)
                        assert (u8(recv[0])[begin:end].numpy() == qc).all()
                        assert (recv[1][begin:end].numpy() == qs).all()
                    assert (vals[begin:end, :-128] == j).all()
                    assert (vals[begin:end, -128:] == srcs[j].numpy()[:, None]).all()
                if with_topk:
                    ti = all_idx[j][srcs[j]]
                    local = torch.where((ti // El == rank) & (ti >= 0), ti - rank * El, -1)
                    assert torch.equal(r_idx[begin:end], local)
                begin = end
            if with_topk:
                r_w_sent = r_w.clone()
                if current is not rand:  # DeepEP's test fills the non-local weights
                    r_w_sent[r_idx.eq(-1)] = r_w.amax(dim=1, keepdim=True).expand_as(r_w)[
                        r_idx.eq(-1)]
            else:
                again = buf.dispatch(current, handle=handle)[0]  # cached dispatch
                assert torch.equal(u8(again[0]) if fp8 else again, u8(recv[0]) if fp8 else recv)
            back = torch.from_numpy(f32(bf16(vals))).to(torch.bfloat16)
            kw = dict(topk_weights=r_w_sent) if with_topk else {}
            y, cw, event = buf.combine(back, handle, async_finish=True, **kw)
            event.current_stream_wait()
            src = f32(current) if current is rand else f32(bf16(
                f8.dequantize(codes, scales) if fp8 else xs[rank]))
            ref = np.zeros_like(src)
            for t in range(TOKENS):  # the same bf16 row from each destination, summed in fp32
                acc = np.zeros(HIDDEN, np.float32)
                for _ in range(int(n_dest[t])):
                    acc = (acc + src[t]).astype(np.float32)
                ref[t] = acc
            assert (f32(y) == f32(bf16(ref))).all()
            assert calc_diff(y.float() / n_dest.clamp(min=1), torch.from_numpy(src)) < 5e-6
            if with_topk:
                want_w = (n_dest * rank).expand(TOKENS, TOPK) if current is not rand else \
                    wt.masked_fill(idx == -1, 0)
                assert torch.equal(cw, want_w), (cw, want_w)
            else:
                assert cw is None


def run(buf_group, comm, rank, R, algorithm, use_comm=False):
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(TOKENS, HIDDEN, R, EXPERTS)
    nvl = deep_ep.Config().get_nvl_buffer_size_hint(HIDDEN * 2, R)
    # DeepEP takes an mpi4py communicator as comm= (group=None).
    buf = deep_ep.Buffer(None if use_comm else buf_group, comm=buf_group if use_comm else None,
                         num_nvl_bytes=nvl, num_rdma_bytes=hint, low_latency_mode=True,
                         num_qps_per_rank=EXPERTS // R, explicitly_destroy=True,
                         algorithm=algorithm, timeout=60.0)
    n = check_low_latency(buf, comm, rank, R, seed=1)
    check_normal(buf, comm, rank, R, seed=1)
    check_low_latency(buf, comm, rank, R, seed=2)  # after normal mode, as DeepEP's suite does
    buf.destroy()
    print(f"rank {rank}: OK ({n} low-latency configs, normal mode)", flush=True)


def spawn_main(local_rank, R, algorithm, port):
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=local_rank,
                            world_size=R)
    run(dist.group.WORLD, Comm(), local_rank, R, algorithm)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        R = int(sys.argv[2])
        torch.multiprocessing.spawn(spawn_main, args=(R, sys.argv[3], port), nprocs=R)
    else:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        run(comm, Comm(comm), comm.Get_rank(), comm.Get_size(), sys.argv[2], use_comm=True)
