// HostEngine's rows outside the algorithms: where a dispatch's rows come from on the sender (the
// caller's x and x_scales, or an fp8 copy cast on send) and the compact() copy of the received
// rows with their scales.
#include "ep/host_engine.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep {

// Where this rank's dispatch rows come from: x (and x_scales) as given, or for bf16/fp32 x on
// an fp8 buffer, a copy cast to e4m3 by the role team (tokens split in equal slices; each
// member writes only its own rows, and run_roles returns after every member's writes).
void ep::HostEngine::set_dispatch_source(const DispatchArgs& a) {
  const protocol::RowCodec& c = codec();
  if (cfg.dtype != DType::kFP8E4M3 || a.x.dtype == DType::kFP8E4M3) {
    call.source = {static_cast<const char*>(a.x.data), static_cast<const char*>(a.x_scales.data),
                   c};
    return;
  }
  const int64_t n = a.x.dim(0), blocks = fp8_scales_per_row(cfg.hidden);
  const int members = dp->members();
  auto* codes = cast_x.get<uint8_t>();
  auto* scales = cast_scales.get<float>();
  dp->run_roles([&](int m) {
    const int64_t t0 = n * m / members, t1 = n * (m + 1) / members;
    fp8_quantize_rows(static_cast<const char*>(a.x.data) +
                          static_cast<size_t>(t0 * cfg.hidden) * dtype_size(a.x.dtype),
                      a.x.dtype, t1 - t0, cfg.hidden, cfg.fp8_pow2_scales, codes + t0 * cfg.hidden,
                      scales + t0 * blocks);
  });
  call.source = {cast_x.get(), cast_scales.get(), c};
}

TensorView ep::HostEngine::compact_rows() {
  const protocol::WindowLayout& m = win.map();
  const bool tp = call.layout == Layout::kThroughput;
  const char* from = win.at<char>(rank, tp ? m.tp_x : m.lat_x);
  const char* from_scales = win.at<char>(rank, tp ? m.tp_scale : m.lat_scale);
  char* to = compacted.get();
  const size_t xb = codec().payload_bytes, sb = codec().scale_bytes;
  call.for_each_output_row(0, 1, [&](int64_t row, int64_t packed) {
    const auto from_row = static_cast<size_t>(row), to_row = static_cast<size_t>(packed);
    dp->put(to + to_row * xb, from + from_row * xb, xb);
    if (sb) dp->put(compacted_scales.get() + to_row * sb, from_scales + from_row * sb, sb);
  });
  compacted_rows = call.num_recv_rows;
  return TensorView(to, cfg.dtype, {call.num_recv_rows, cfg.hidden});
}

TensorView ep::HostEngine::compact_scales() const {
  const HostEngine& b = *this;
  UBEP_CHECK_ARG(b.codec().scale_bytes != 0, "compact_scales: the buffer's dtype ",
                 dtype_name(b.cfg.dtype), " has no scales (only fp8 has)");
  UBEP_CHECK_ARG(b.compacted_rows >= 0, "compact_scales: call compact() first");
  return TensorView(b.compacted_scales.get(), DType::kFP32,
                    {b.compacted_rows, fp8_scales_per_row(b.cfg.hidden)});
}
}  // namespace ubep
