#include "backend/cuda/host_logic.hpp"

#include <algorithm>

#include "protocol/call_checks.hpp"
#include "protocol/config_checks.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda_host {

namespace {
// The kernels' call-shape word (cuda_hd::call_shape_of) spells the enums' values.
static_assert(static_cast<int>(Layout::kThroughput) == 0 &&
              static_cast<int>(Layout::kLatency) == 1);
static_assert(static_cast<int>(Placement::kCompact) == 1 &&
              static_cast<int>(Placement::kPerSource) == 2);
}  // namespace

void check_config(const BufferConfig& cfg, int ranks, int local_ranks) {
  UBEP_CHECK_ARG(cfg.device.type == DeviceType::kCuda || cfg.device.type == DeviceType::kCudaSim,
                 "CUDA buffer: config.device is ", cfg.device.describe(),
                 ", expected cuda:<index> or cuda-sim:<index>");
  UBEP_CHECK_ARG(ranks >= 1, "CUDA buffer: ranks ", ranks, " < 1");
  UBEP_CHECK_ARG(local_ranks >= 1 && local_ranks <= cuda_hd::kMaxVirtualRanks,
                 "CUDA buffer: ", local_ranks, " ranks in one launch, at most ",
                 cuda_hd::kMaxVirtualRanks);
  UBEP_CHECK_ARG(ranks <= cuda_hd::kMaxContributions, "CUDA buffer: ranks ", ranks, " exceeds ",
                 cuda_hd::kMaxContributions);
  UBEP_CHECK_ARG(cfg.dtype != DType::kFP8E4M3, "CUDA buffer on ", cfg.device.describe(),
                 ": dtype must be bf16 or fp32, got ", dtype_name(cfg.dtype),
                 " (fp8 dispatch is not implemented by the CUDA kernels; the CPU has it)");
  protocol::check_buffer_config(cfg, ranks, "CUDA buffer",
                                {.fp8 = false, .max_topk = cuda_hd::kMaxContributions});
}

void check_dispatch(const DispatchArgs& a, const BufferConfig& cfg, int rank, bool ids_on_host) {
  // The host backend's checks and messages; the rank is named too, since one launch of virtual
  // ranks checks the arguments of all of them.
  try {
    protocol::check_dispatch_args(a, cfg);
    if (ids_on_host) protocol::check_expert_ids(a, cfg);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(e.what(), " (rank ", rank, ")"));
  }
}

void check_combine(const CombineArgs& a, const BufferConfig& cfg, const TensorView& recv_x,
                   uint64_t handle, int rank) {
  UBEP_CHECK_ARG(a.handle == handle, "combine: handle ", a.handle, " is not the last dispatch's ",
                 handle, " (rank ", rank, ")");
  UBEP_CHECK_ARG(a.x.device == cfg.device, "combine: x is on ", a.x.device.describe(),
                 ", the buffer on ", cfg.device.describe());
  if (a.compacted) {
    // Dense rows in compact() order. How many were received is known only on the device: the
    // kernel refuses (kCompactedShort) an input with fewer rows than that.
    UBEP_CHECK_ARG(a.x.dtype == recv_x.dtype && a.x.ndim == 2 && a.x.dim(1) == cfg.hidden,
                   "combine: compacted x must be ", dtype_name(recv_x.dtype), "[rows, ", cfg.hidden,
                   "], got ", a.x.describe());
  } else {
    UBEP_CHECK_ARG(
        a.x.dtype == recv_x.dtype && a.x.ndim == recv_x.ndim && a.x.shape == recv_x.shape,
        "combine: x must be shaped like recv_x ", recv_x.describe(), ", got ", a.x.describe());
  }
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
  UBEP_CHECK_ARG(
      a.topk_weights.data == nullptr,
      "combine: CombineArgs::topk_weights is not supported by the CUDA backend (the weights "
      "given to dispatch are used)");
}

int blocks_per_rank(int requested, int coresident, int local_ranks) {
  const int fit = coresident / std::max(local_ranks, 1);
  UBEP_CHECK_ARG(fit >= 1, "CUDA buffer: ", local_ranks, " ranks need ", local_ranks,
                 " co-resident blocks, the device holds ", coresident);
  int b = requested > 0 ? requested : fit;
  b = std::min({b, fit, cuda_hd::kMaxBlocksPerRank});
  return std::max(b, 1);
}

size_t dispatch_smem(int warps, int max_topk, int local_experts) {
  return static_cast<size_t>(warps) *
         (32u * static_cast<size_t>(max_topk) + static_cast<size_t>(local_experts)) * sizeof(int);
}

protocol::WindowLayout window_layout(const BufferConfig& cfg, int ranks) {
  return protocol::WindowLayout(static_cast<size_t>(cfg.hidden) * dtype_size(cfg.dtype), ranks,
                                cfg.num_experts / ranks, cfg.max_topk, cfg.max_tokens_per_rank,
                                cfg.enable_latency_layout);
}

cuda_hd::ScratchLayout scratch_layout(const BufferConfig& cfg, int ranks) {
  return cuda_hd::ScratchLayout(ranks, cfg.num_experts / ranks, cfg.max_topk,
                                cfg.max_tokens_per_rank);
}

namespace {
TensorView view(void* p, DType t, std::initializer_list<int64_t> dims, Device d) {
  TensorView v(p, t, dims);
  v.device = d;
  return v;
}
}  // namespace

DispatchResult dispatch_views(const protocol::WindowLayout& m, const BufferConfig& cfg, void* base,
                              int half, Layout layout, Placement placement, int topk,
                              void* recv_count, void* recv_range, uint64_t handle) {
  DispatchResult r;
  r.layout = layout;
  r.placement = placement;
  r.num_recv_rows = -1;  // on the device (recv_count) until someone synchronises
  r.handle = handle;
  const Device d = cfg.device;
  const int64_t RT = m.tp_rows(), El = m.local_experts;
  if (layout == Layout::kThroughput) {
    r.recv_x = view(m.at<char>(base, half, m.tp_x), cfg.dtype, {RT, cfg.hidden}, d);
    r.recv_topk_idx = view(m.at<char>(base, half, m.tp_idx), DType::kInt32, {RT, topk}, d);
    r.recv_topk_weights = view(m.at<char>(base, half, m.tp_w), DType::kFP32, {RT, topk}, d);
    r.recv_src = view(m.at<char>(base, half, m.tp_src), DType::kInt64, {RT, 2}, d);
  } else {
    r.recv_x = view(m.at<char>(base, half, m.lat_x), cfg.dtype, {El, RT, cfg.hidden}, d);
    r.recv_src = view(m.at<char>(base, half, m.lat_src), DType::kInt64, {El, RT, 2}, d);
  }
  r.recv_count = view(recv_count, DType::kInt64, {El}, d);
  r.recv_range = layout == Layout::kThroughput
                     ? view(recv_range, DType::kInt64, {m.ranks, 2}, d)
                     : view(recv_range, DType::kInt64, {El, m.ranks, 2}, d);
  return r;
}

TensorView combine_view(const protocol::WindowLayout& m, const BufferConfig& cfg, void* base,
                        int half, Layout layout) {
  const int64_t RT = m.tp_rows(), El = m.local_experts;
  char* p = m.at<char>(base, half, m.comb_x);
  return layout == Layout::kThroughput ? view(p, cfg.dtype, {RT, cfg.hidden}, cfg.device)
                                       : view(p, cfg.dtype, {El, RT, cfg.hidden}, cfg.device);
}

std::string describe(const cuda_hd::ErrorInfo& e, double timeout_s) {
  switch (e.code) {
    case cuda_hd::kOk:
      return "no error";
    case cuda_hd::kBadExpert:
      return detail::concat("dispatch (rank ", e.rank, "): the expert id at flat index ", e.index,
                            " of topk_idx (token*topk + k) is outside [-1, num_experts) or repeats "
                            "an earlier id of its token; it was routed nowhere");
    case cuda_hd::kShapeMismatch:
      return detail::concat("dispatch: rank ", e.peer,
                            " made a different call (layout or placement) than rank ", e.rank,
                            " (its count record has call shape ", e.index,
                            "); every rank must make the same call with the same "
                            "BufferConfig::placement");
    case cuda_hd::kCompactedShort:
      return detail::concat("combine (rank ", e.rank, "): compacted input has ", e.tag,
                            " rows, fewer than the ", e.index, " rows this rank received");
    case cuda_hd::kPeerFailed:
      return detail::concat("rank ", e.peer,
                            protocol::is_broken(e.tag) ? " failed (its buffer is broken)"
                                                       : " rejected its input for this call",
                            ", so the call cannot complete on rank ", e.rank);
    case cuda_hd::kTopkMismatch:
      return detail::concat("dispatch: rank ", e.peer, " sent topk ", e.index, " to rank ", e.rank,
                            ", which dispatched with a different topk");
    case cuda_hd::kTimeout: {
      std::string what;
      switch (e.what) {
        case cuda_hd::kWaitCount:
          what = detail::concat("the count record of rank ", e.peer, " at rank ", e.index);
          break;
        case cuda_hd::kWaitDispatchRow:
          what = detail::concat("dispatch row ", e.index, " at rank ", e.rank);
          break;
        case cuda_hd::kWaitCombineRow:
          what = detail::concat("the combine row of token ", e.index, " at rank ", e.peer);
          break;
        case cuda_hd::kWaitBarrier:
          what = detail::concat("rank ", e.peer, " at bsp's group barrier");
          break;
        default:
          what = detail::concat("a signal between the blocks of rank ", e.rank, " (item ", e.index,
                                ")");
      }
      return detail::concat("rank ", e.rank, " timed out after ", timeout_s, " s waiting for ",
                            what, " (epoch tag ", e.tag,
                            "; is that rank alive, making the same call, and did it accept its "
                            "inputs?)");
    }
    default:
      return detail::concat("unknown CUDA kernel error code ", e.code);
  }
}

void throw_if_error(const cuda_hd::ErrorInfo& e, double timeout_s) {
  if (e.code == cuda_hd::kOk || e.code == 0xFFFFFFFFu) return;
  if (e.code == cuda_hd::kTimeout) throw TimeoutError(describe(e, timeout_s));
  if (e.code == cuda_hd::kPeerFailed) throw PeerFailedError(describe(e, timeout_s));
  throw InvalidArgument(describe(e, timeout_s));
}

}  // namespace ubep::cuda_host
