"""transformers MoE models made expert-parallel: small random-weight models and the experts
modules that replace their expert loops (docs/INTEGRATIONS.md).

transformers 5 keeps every MoE block's experts in one module (``Qwen3MoeExperts``,
``MixtralExperts``, ``DeepseekV3Experts``, ...): fused weights ``gate_up_proj [E, 2I, H]`` and
``down_proj [E, H, I]``, ``act_fn``, and ``forward(hidden [T, H], top_k_index [T, k],
top_k_weights [T, k]) -> [T, H]`` (the router runs before it, shared experts after it). So
expert parallelism is one swap per MoE layer: ``shard_experts(model, make)`` replaces each such
module by ``make(experts, layer)``, an object holding only this rank's experts that moves the
tokens to their experts' ranks and back:

* ``UbepExperts``: ubep.Buffer dispatch (latency layout) -> local experts writing into ubep's
  combine buffer -> combine with the router's weights (algorithm "ubep" or "bsp");
* ``TorchA2AExperts``: what a PyTorch user writes with torch.distributed: rows permuted by
  destination rank, ``all_to_all_single`` of counts, rows and expert ids, local experts,
  ``all_to_all_single`` back, weighted ``index_add_``.

Both count the seconds spent in their communication calls (``CommClock``).
"""
import time

import torch
import torch.nn.functional as F

ARCHS = ("qwen3_moe", "mixtral", "deepseek_v3")


def small_config(arch, num_experts=16, top_k=4, hidden=256, layers=4, vocab=1024):
    """A transformers config small enough for 2 cores (no hub: built from its class)."""
    import transformers as tf
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  num_experts_per_tok=top_k, tie_word_embeddings=False)
    if arch == "qwen3_moe":
        return tf.Qwen3MoeConfig(**common, num_experts=num_experts, intermediate_size=512,
                                 moe_intermediate_size=128, head_dim=64, norm_topk_prob=True,
                                 decoder_sparse_step=1)
    if arch == "mixtral":
        return tf.MixtralConfig(**common, num_local_experts=num_experts, intermediate_size=128,
                                head_dim=64)
    if arch == "deepseek_v3":
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: one KV per head
        return tf.DeepseekV3Config(**common, n_routed_experts=num_experts, n_shared_experts=1,
                                   moe_intermediate_size=128, intermediate_size=512,
                                   first_k_dense_replace=1, n_group=4, topk_group=2,
                                   q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16,
                                   qk_nope_head_dim=32, v_head_dim=32, norm_topk_prob=True,
                                   rope_scaling=None)
    raise ValueError(f"unknown architecture {arch!r}; expected one of {', '.join(ARCHS)}")


def build_model(arch, seed=0, dtype=torch.float32, **config_args):
    """The model from ``small_config`` with random weights drawn from ``seed`` (the same on every
    rank), in eval mode. Router weights are drawn too: transformers starts some at zero."""
    import transformers as tf
    config = small_config(arch, **config_args)
    torch.manual_seed(seed)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for _, experts in find_experts(model):
            for p in (experts.gate_up_proj, experts.down_proj):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
        for name, p in model.named_parameters():
            if name.endswith("gate.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model


def find_experts(model):
    """(parent module, experts module) of every MoE layer: modules named ``experts`` with fused
    gate_up_proj / down_proj weights."""
    found = []
    for parent in model.modules():
        experts = getattr(parent, "experts", None)
        if isinstance(experts, torch.nn.Module) and hasattr(experts, "gate_up_proj"):
            found.append((parent, experts))
    return found


def shard_experts(model, make):
    """Replaces every MoE layer's experts module by ``make(experts, layer_index)``; returns the
    new modules."""
    made = []
    for i, (parent, experts) in enumerate(find_experts(model)):
        parent.experts = make(experts, i)
        made.append(parent.experts)
    return made


class CommClock:
    """Seconds spent in communication calls, shared by a model's expert modules."""

    def __init__(self):
        self.seconds = 0.0

    def reset(self):
        self.seconds = 0.0


class _LocalExperts(torch.nn.Module):
    """This rank's slice of an experts module: experts [first, first + count)."""

    def __init__(self, experts, rank, ranks):
        super().__init__()
        total = experts.gate_up_proj.shape[0]
        if total % ranks:
            raise ValueError(f"{total} experts do not split over {ranks} ranks")
        self.count = total // ranks
        self.first = rank * self.count
        sl = slice(self.first, self.first + self.count)
        self.gate_up_proj = torch.nn.Parameter(experts.gate_up_proj.data[sl].clone())
        self.down_proj = torch.nn.Parameter(experts.down_proj.data[sl].clone())
        self.act_fn = experts.act_fn
        self.num_experts = total

    def expert(self, e, x):
        """Local expert e (0-based) on rows x, as transformers' experts loop computes it."""
        gate, up = F.linear(x, self.gate_up_proj[e]).chunk(2, dim=-1)
        return F.linear(self.act_fn(gate) * up, self.down_proj[e])


class UbepExperts(_LocalExperts):
    """dispatch -> local experts -> combine over one ubep.Buffer (shared by the layers: calls
    come in the same order on every rank, and a layer's combine ends before the next layer's
    dispatch)."""

    def __init__(self, experts, buffer, clock, unweighted=False):
        super().__init__(experts, buffer.rank, buffer.num_ranks)
        self.buffer, self.clock = buffer, clock
        self.unweighted = unweighted  # tests only: a wrong layer the token check must catch

    @torch.no_grad()
    def forward(self, hidden_states, top_k_index, top_k_weights):
        buf = self.buffer
        x = hidden_states.contiguous()
        t0 = time.perf_counter()
        r = buf.dispatch(x, top_k_index.long().contiguous(), layout="latency")
        self.clock.seconds += time.perf_counter() - t0
        out = buf.combine_buffer(r.handle)
        for e, n in enumerate(r.recv_count.tolist()):
            if n:
                out[e, :n] = self.expert(e, r.recv_x[e, :n])
        weights = top_k_weights.float().contiguous()
        if self.unweighted:
            weights = torch.ones_like(weights)
        t0 = time.perf_counter()
        y = buf.combine(out, r.handle, weights, copy=True)
        self.clock.seconds += time.perf_counter() - t0
        return y


class TorchA2AExperts(_LocalExperts):
    """The same layer over torch.distributed ``all_to_all_single`` (gloo on CPU)."""

    def __init__(self, experts, rank, ranks, clock, group=None):
        super().__init__(experts, rank, ranks)
        self.ranks, self.clock, self.group = ranks, clock, group

    def _a2a(self, send, send_splits, recv_splits, tail_shape, dtype):
        import torch.distributed as dist
        recv = torch.empty((sum(recv_splits),) + tail_shape, dtype=dtype)
        t0 = time.perf_counter()
        dist.all_to_all_single(recv, send, recv_splits, send_splits, group=self.group)
        self.clock.seconds += time.perf_counter() - t0
        return recv

    @torch.no_grad()
    def forward(self, hidden_states, top_k_index, top_k_weights):
        import torch.distributed as dist
        tokens, k = top_k_index.shape
        hidden = hidden_states.shape[1]
        flat_e = top_k_index.reshape(-1).long()
        flat_t = torch.arange(tokens).repeat_interleave(k)
        dest = torch.div(flat_e, self.count, rounding_mode="floor")
        order = torch.sort(dest, stable=True).indices
        send_counts = torch.bincount(dest, minlength=self.ranks)
        recv_counts = torch.empty_like(send_counts)
        t0 = time.perf_counter()
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        self.clock.seconds += time.perf_counter() - t0
        ss, rs = send_counts.tolist(), recv_counts.tolist()
        rows = self._a2a(hidden_states[flat_t[order]].contiguous(), ss, rs, (hidden,),
                         hidden_states.dtype)
        ids = self._a2a(flat_e[order].contiguous(), ss, rs, (), torch.int64) - self.first
        out = torch.empty_like(rows)
        for e in range(self.count):
            sel = (ids == e).nonzero().flatten()
            if len(sel):
                out[sel] = self.expert(e, rows[sel]).to(out.dtype)
        back = self._a2a(out, rs, ss, (hidden,), out.dtype)
        weights = top_k_weights.reshape(-1)[order].float()
        y = torch.zeros(tokens, hidden, dtype=torch.float32)
        y.index_add_(0, flat_t[order], back.float() * weights[:, None])
        return y.to(hidden_states.dtype)
