// ep::HostEngine's inputs: routing a dispatch and where its rows come from (the caller's x and
// x_scales, or an fp8 copy cast on send), the checks of a combine's arguments, and the compact()
// copy of the received rows with their scales.
#include "ep/host_engine.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep::ep {

void HostEngine::begin_dispatch(const DispatchArgs& a) {
  UBEP_CHECK_ARG(a.layout == Layout::kThroughput || cfg_.enable_latency_layout,
                 "dispatch: latency layout requested but the buffer was created with "
                 "enable_latency_layout=false");
  // Validates: throws before anything is sent; the rows are taken (cast) once a is valid.
  call_.route(a, cfg_, [&] { return dispatch_rows(a); });
  dispatch_seq_ = window_.begin_call();
  machine_.dispatched();
  compacted_rows_ = -1;
}

// Where this rank's dispatch rows come from: x (and x_scales) as given, or for bf16/fp32 x on
// an fp8 buffer, a copy cast to e4m3 by the role team (tokens split in equal slices; each
// member writes only its own rows, and run_roles returns after every member's writes).
RowArrays HostEngine::dispatch_rows(const DispatchArgs& a) {
  const protocol::RowCodec& c = codec();
  if (cfg_.dtype != DType::kFP8E4M3 || a.x.dtype == DType::kFP8E4M3)
    return {static_cast<const char*>(a.x.data), static_cast<const char*>(a.x_scales.data), c};
  const int64_t n = a.x.dim(0), blocks = fp8_scales_per_row(cfg_.hidden);
  const int members = data_path_->members();
  auto* codes = cast_x_.get<uint8_t>();
  auto* scales = cast_scales_.get<float>();
  data_path_->run_roles([&](int member) {
    const int64_t t0 = n * member / members, t1 = n * (member + 1) / members;
    fp8_quantize_rows(static_cast<const char*>(a.x.data) +
                          static_cast<size_t>(t0 * cfg_.hidden) * dtype_size(a.x.dtype),
                      a.x.dtype, t1 - t0, cfg_.hidden, cfg_.fp8_pow2_scales,
                      codes + t0 * cfg_.hidden, scales + t0 * blocks);
  });
  return {cast_x_.get(), cast_scales_.get(), c};
}

void HostEngine::check_combine(const CombineArgs& a) const {
  UBEP_CHECK_ARG(machine_.idle(),
                 "combine: a split-phase call is still outstanding on this buffer");
  machine_.require_dispatch("combine");
  UBEP_CHECK_ARG(!machine_.combined() || !multi_host(), "combine: dispatch ", dispatch_seq_,
                 " was already combined; a repeated combine of one dispatch needs the group on "
                 "one host, this one spans ",
                 group_.num_hosts());
  UBEP_CHECK_ARG(a.handle == dispatch_seq_, "combine: handle ", a.handle,
                 " does not belong to the last dispatch on this buffer (", dispatch_seq_, ")");
  UBEP_CHECK_ARG(a.x.dtype == combine_dtype_, "combine: x dtype ", dtype_name(a.x.dtype),
                 " does not match the buffer's combine dtype ", dtype_name(combine_dtype_),
                 cfg_.dtype == DType::kFP8E4M3 ? " (fp8 buffers combine in bf16)" : "");
  if (a.compacted || call_.layout() == Layout::kThroughput) {
    const int64_t rows = a.compacted ? call_.num_recv_rows() : call_.throughput_span();
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == rows && a.x.dim(1) == cfg_.hidden,
                   "combine: x must be [", rows, ", ", cfg_.hidden, "] (",
                   a.compacted ? "the rows in compact() order"
                   : call_.placement() == Placement::kPerSource
                       ? "shaped like recv_x: per-source placement"
                       : "one row per received row",
                   "), got ", a.x.describe());
  } else {
    UBEP_CHECK_ARG(a.x.ndim == 3 && a.x.dim(0) == local_experts_ &&
                       a.x.dim(1) == call_.expert_slots() && a.x.dim(2) == cfg_.hidden,
                   "combine: x must be [", local_experts_, ", ", call_.expert_slots(), ", ",
                   cfg_.hidden, "] (latency layout), got ", a.x.describe());
  }
  UBEP_CHECK_ARG(a.x.data != nullptr || a.x.numel() == 0, "combine: x has no data");
  if (a.out.ndim != 0)
    UBEP_CHECK_ARG(a.out.ndim == 2 && a.out.dtype == combine_dtype_ &&
                       a.out.dim(0) == call_.routing().num_tokens && a.out.dim(1) == cfg_.hidden &&
                       a.out.device == cfg_.device && (a.out.data || a.out.numel() == 0),
                   "combine: out must be ", dtype_name(combine_dtype_), " [",
                   call_.routing().num_tokens, ", ", cfg_.hidden, "] on ", cfg_.device.describe(),
                   ", got ", a.out.describe());
  UBEP_CHECK_ARG(a.x.device == cfg_.device, "combine: x is on ", a.x.device.describe(),
                 ", the buffer on ", cfg_.device.describe());
  if (a.topk_weights.ndim != 0) {
    const TensorView& w = a.topk_weights;
    const Routing& routing = call_.routing();
    UBEP_CHECK_ARG(call_.layout() == Layout::kLatency,
                   "combine: topk_weights can only replace the dispatch's in the latency layout");
    UBEP_CHECK_ARG(!multi_host(), "combine: topk_weights cannot be replaced across hosts");
    UBEP_CHECK_ARG(w.device.type == DeviceType::kCpu,
                   "combine: topk_weights must be in host memory, got ", w.device.describe());
    UBEP_CHECK_ARG(w.ndim == 2 && w.dtype == DType::kFP32 && w.dim(0) == routing.num_tokens &&
                       w.dim(1) == routing.topk && (w.data != nullptr || w.numel() == 0),
                   "combine: topk_weights must be fp32 [", routing.num_tokens, ", ", routing.topk,
                   "] like the dispatch's topk_idx, got ", w.describe());
  }
}

TensorView HostEngine::compact_rows() {
  const protocol::WindowLayout& map = window_.map();
  const bool throughput = call_.layout() == Layout::kThroughput;
  const char* from = window_.at<char>(rank_, throughput ? map.tp_x : map.lat_x);
  const char* from_scales = window_.at<char>(rank_, throughput ? map.tp_scale : map.lat_scale);
  char* to = compacted_.get();
  const size_t payload = codec().payload_bytes, scale_bytes = codec().scale_bytes;
  call_.for_each_output_row(0, 1, [&](int64_t row, int64_t packed) {
    const auto from_row = static_cast<size_t>(row), to_row = static_cast<size_t>(packed);
    data_path_->put(to + to_row * payload, from + from_row * payload, payload);
    if (scale_bytes)
      data_path_->put(compacted_scales_.get() + to_row * scale_bytes,
                      from_scales + from_row * scale_bytes, scale_bytes);
  });
  compacted_rows_ = call_.num_recv_rows();
  return TensorView(to, cfg_.dtype, {call_.num_recv_rows(), cfg_.hidden});
}

TensorView HostEngine::compact_scales() const {
  UBEP_CHECK_ARG(codec().scale_bytes != 0, "compact_scales: the buffer's dtype ",
                 dtype_name(cfg_.dtype), " has no scales (only fp8 has)");
  UBEP_CHECK_ARG(compacted_rows_ >= 0, "compact_scales: call compact() first");
  return TensorView(compacted_scales_.get(), DType::kFP32,
                    {compacted_rows_, fp8_scales_per_row(cfg_.hidden)});
}

}  // namespace ubep::ep
