"""A small Mixture-of-Experts layer whose forward moves tokens with ubep, checked against the
same layer computed densely on one process.

    python3 -m torch.distributed.run --nproc_per_node 2 examples/moe_layer.py     # torchrun
    mpirun -np 2 python3 examples/moe_layer.py                                    # mpi4py
    python3 examples/moe_layer.py                                                 # 2 thread ranks

(Debian's torch 1.13 on Python 3.11: add ``--redirects 1 --tee 1`` to torch.distributed.run,
whose default hits an enum change of Python 3.11; torch >= 2 spells it --nproc-per-node.)

Every rank builds the whole layer from the same seed (router, top-k gate, experts as
torch.nn.Linear pairs) and keeps the experts it owns (rank r: experts [r*E/R, (r+1)*E/R)).
forward(): route, ubep.Buffer.dispatch (latency layout), run each local expert on its received
rows writing into ubep's zero-copy combine buffer, combine (which applies the gate weights).
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

import ubep


class Expert(nn.Module):
    def __init__(self, hidden, ffn):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class MoELayer(nn.Module):
    """Router + top-k + experts; forward over ubep when given a buffer, densely otherwise."""

    def __init__(self, hidden, ffn, num_experts, topk, seed=0):
        super().__init__()
        torch.manual_seed(seed)  # the same weights on every rank
        self.router = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, ffn) for _ in range(num_experts))
        self.num_experts, self.topk = num_experts, topk

    def route(self, x):
        probs = torch.softmax(self.router(x), dim=-1)
        weights, idx = torch.topk(probs, self.topk, dim=-1)
        return idx, (weights / weights.sum(dim=-1, keepdim=True)).float()

    @torch.no_grad()
    def forward(self, x, buffer):
        idx, weights = self.route(x)
        r = buffer.dispatch(x, idx, layout="latency")  # the weights come with combine
        out = buffer.combine_buffer(r.handle)
        first = buffer.rank * buffer.num_local_experts
        for e, n in enumerate(r.recv_count.tolist()):
            if n:
                out[e, :n] = self.experts[first + e](r.recv_x[e, :n])
        y = buffer.combine(out, r.handle, weights, copy=True)  # zero copy: out is ubep's memory
        return y

    @torch.no_grad()
    def forward_dense(self, x):
        """The same layer on one process: every expert local, y = sum_k w_k * expert_k(x)."""
        idx, weights = self.route(x)
        y = torch.zeros(x.shape, dtype=torch.float32)
        for t in range(x.shape[0]):
            for k in range(self.topk):
                e = int(idx[t, k])
                y[t] += weights[t, k] * self.experts[e](x[t:t + 1])[0].float()
        return y.to(x.dtype)


def make_layer(args):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    return MoELayer(args.hidden, args.ffn, args.experts, args.topk).to(dtype)


def run(group, args, layer):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    buffer = ubep.Buffer(group, hidden=args.hidden, num_experts=args.experts,
                         max_tokens_per_rank=args.tokens, max_topk=args.topk, dtype=dtype,
                         algorithm=args.algo)
    rank = buffer.rank
    worst = 0.0
    for step in range(args.steps):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        n = args.tokens - (rank + step) % 3  # ranks differ in token counts
        x = torch.randn(n, args.hidden, generator=gen).to(dtype)
        y = layer(x, buffer)
        ref = layer.forward_dense(x)
        err = (y.float() - ref.float()).abs().max().item() / max(ref.float().abs().max().item(), 1e-6)
        worst = max(worst, err)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    status = "OK" if worst <= tol else "MISMATCH"
    print(f"rank {rank}/{buffer.num_ranks} ({buffer.group.kind}, {args.algo}): {args.steps} "
          f"forward steps, max relative error vs dense {worst:.2e} (tolerance {tol:g}) {status}",
          flush=True)
    return worst <= tol


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=16, help="max tokens per rank")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--ffn", type=int, default=256)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--algo", default="ubep", choices=["ubep", "bsp"])
    p.add_argument("--threads", type=int, default=2, help="thread ranks without a launcher")
    args = p.parse_args()
    torch.set_num_threads(1)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        import torch.distributed as dist
        dist.init_process_group("gloo")
        ok = run(dist.group.WORLD, args, make_layer(args))
        dist.destroy_process_group()
    elif "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:  # mpirun
        from mpi4py import MPI
        ok = run(MPI.COMM_WORLD, args, make_layer(args))
    else:
        # One layer, made before the threads start (nn.Linear draws from the global RNG), shared
        # read-only by the thread ranks.
        layer = make_layer(args)
        ok = all(ubep.run_on_threads(args.threads, lambda g: run(g, args, layer)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
