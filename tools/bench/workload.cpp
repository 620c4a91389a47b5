// The bench's inputs and its expert: random tokens and routing per rank, the identity expert
// that writes its output into the zero-copy combine buffer (or dequantizes fp8), the bytes each
// op moves, and --dump's per-rank .npy files.
#include "workload.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/row_kernels.hpp"
#include "npy.hpp"
#include "ubep/bf16.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep::tools {

Input make_input(const Group& g, const BenchOptions& o) {
  Input in;
  // fp8 inputs start as bf16 values: cast on send, or quantized once here (not timed).
  const bool fp8 = o.dtype == DType::kFP8E4M3;
  const DType value_dtype = fp8 ? DType::kBF16 : o.dtype;
  const size_t es = dtype_size(value_dtype);
  in.x.resize(static_cast<size_t>(o.tokens * o.hidden) * es);
  std::mt19937 rng(static_cast<unsigned>(o.seed * 977 + static_cast<uint64_t>(g.rank())));
  std::uniform_real_distribution<float> v(-1.0f, 1.0f);
  for (int64_t i = 0; i < o.tokens * o.hidden; ++i) {
    const float f = v(rng);
    if (value_dtype == DType::kBF16) {
      const uint16_t b = float_to_bf16(f);
      std::memcpy(&in.x[static_cast<size_t>(i) * 2], &b, 2);
    } else {
      std::memcpy(&in.x[static_cast<size_t>(i) * 4], &f, 4);
    }
  }
  make_routing(o.tokens, o.topk, o.experts, o.routing,
               o.seed * 131 + static_cast<uint64_t>(g.rank()), &in.idx, &in.w);
  in.args.x = TensorView(in.x.data(), value_dtype, {o.tokens, o.hidden});
  if (fp8 && !o.fp8_cast) {
    const int64_t blocks = fp8_scales_per_row(o.hidden);
    in.codes.resize(static_cast<size_t>(o.tokens * o.hidden));
    in.scales.resize(static_cast<size_t>(o.tokens * blocks));
    fp8_quantize_rows(in.x.data(), DType::kBF16, o.tokens, o.hidden, false, in.codes.data(),
                      in.scales.data());
    in.args.x = TensorView(in.codes.data(), DType::kFP8E4M3, {o.tokens, o.hidden});
    in.args.x_scales = TensorView(in.scales.data(), DType::kFP32, {o.tokens, blocks});
  }
  in.args.topk_idx = TensorView(in.idx.data(), DType::kInt64, {o.tokens, o.topk});
  in.args.topk_weights = TensorView(in.w.data(), DType::kFP32, {o.tokens, o.topk});
  in.args.layout = o.layout;
  return in;
}

void expert_fp8_row(const uint8_t* codes, const float* scales, int64_t hidden, float* scratch,
                    uint16_t* out) {
  fp8_dequantize_rows(codes, scales, 1, hidden, scratch);
  kernels::store_row(out, scratch, DType::kBF16, hidden);
}

// The bench's expert is the identity: its output is the received rows. With ubep::Buffer the
// expert writes its output into the zero-copy combine buffer (as a real expert GEMM would write
// its result there); that copy is the expert's work and is not timed. The baseline's combine
// reads the rows where they are.
// fp8 (the combine dtype is bf16): the expert dequantizes its valid rows into bf16, written
// into the combine buffer (Buffer) or a bf16 copy shaped like recv_x (the baseline).
CombineArgs expert_fp8(const DispatchResult& r, Buffer* buf, Input& in, int64_t hidden) {
  TensorView out = r.recv_x;
  out.dtype = DType::kBF16;
  if (buf) {
    out = buf->combine_buffer();
  } else {
    in.expert_out.resize(static_cast<size_t>(r.recv_x.numel()));
    out.data = in.expert_out.data();
  }
  const bool latency = r.layout == Layout::kLatency;
  const int64_t experts = latency ? r.recv_x.dim(0) : 1, rows = latency ? r.recv_x.dim(1) : 0;
  const int64_t nb = fp8_scales_per_row(hidden);
  std::vector<float> row(static_cast<size_t>(hidden));
  auto convert = [&](int64_t at, int64_t n) {
    for (int64_t i = at; i < at + n; ++i)
      expert_fp8_row(r.recv_x.as<const uint8_t>() + i * hidden,
                     r.recv_x_scales.as<const float>() + i * nb, hidden, row.data(),
                     out.as<uint16_t>() + i * hidden);
  };
  for (int64_t e = 0; e < experts; ++e) {
    if (r.recv_range.ndim == 0) {  // the baseline: rows packed from 0
      convert(e * rows, latency ? r.recv_count.as<const int64_t>()[e] : r.num_recv_rows);
      continue;
    }
    const int64_t ranks = r.recv_range.dim(latency ? 1 : 0);
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t* rr = r.recv_range.as<const int64_t>() + 2 * (e * ranks + s);
      convert(e * rows + rr[0], rr[1]);
    }
  }
  return CombineArgs{out, r.handle};
}

void read_every_line(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  unsigned sum = 0;
  for (size_t i = 0; i < bytes; i += 64) sum += p[i];
  asm volatile("" : : "r"(sum));  // the loads happen
}

CombineArgs expert_identity(const DispatchResult& r, Buffer* buf, size_t row_bytes) {
  if (!buf) return CombineArgs{r.recv_x, r.handle};
  TensorView out = buf->combine_buffer();
  const auto* src = static_cast<const char*>(r.recv_x.data);
  auto* dst = static_cast<char*>(out.data);
  // The valid rows: each (expert, source) range of recv_range (contiguous when compact).
  const bool latency = r.layout == Layout::kLatency;
  const int64_t experts = latency ? r.recv_x.dim(0) : 1, ranks = r.recv_range.dim(latency ? 1 : 0);
  const int64_t rows = latency ? r.recv_x.dim(1) : 0;
  const auto* range = r.recv_range.as<const int64_t>();
  for (int64_t e = 0; e < experts; ++e)
    for (int64_t s = 0; s < ranks; ++s) {
      const int64_t* rr = range + 2 * (e * ranks + s);
      const size_t at = static_cast<size_t>(e * rows + rr[0]) * row_bytes;
      std::memcpy(dst + at, src + at, static_cast<size_t>(rr[1]) * row_bytes);
    }
  return CombineArgs{out, r.handle};
}

double dispatch_bytes(const DispatchResult& r, size_t row_bytes) {
  if (r.layout == Layout::kThroughput)
    return static_cast<double>(r.num_recv_rows) * static_cast<double>(row_bytes);
  double rows = 0;
  for (int64_t e = 0; e < r.recv_count.dim(0); ++e)
    rows += static_cast<double>(r.recv_count.as<int64_t>()[e]);
  return rows * static_cast<double>(row_bytes);
}

double combine_bytes(const Input& in, const BenchOptions& o, int ranks, size_t row_bytes) {
  // Rows coming back to this rank: one per (token, destination rank) or per selected (token, k).
  const int El = o.experts / ranks;
  double rows = 0;
  for (int64_t t = 0; t < o.tokens; ++t) {
    std::vector<bool> seen(static_cast<size_t>(ranks), false);
    for (int j = 0; j < o.topk; ++j) {
      const int64_t e = in.idx[static_cast<size_t>(t * o.topk + j)];
      if (e < 0) continue;
      if (o.layout == Layout::kLatency)
        rows += 1;
      else if (!seen[static_cast<size_t>(e / El)]) {
        seen[static_cast<size_t>(e / El)] = true;
        rows += 1;
      }
    }
  }
  return rows * static_cast<double>(row_bytes);
}

void dump_call(Group& g, const BenchOptions& o, const Input& in, const DispatchResult& r,
               const TensorView& y, const std::string& impl) {
  namespace fs = std::filesystem;
  fs::create_directories(o.dump);
  const std::string p = o.dump + "/rank" + std::to_string(g.rank()) + "_";
  const bool bf = o.dtype == DType::kBF16;
  const std::string xd = bf ? "<u2" : "<f4";
  const size_t es = dtype_size(o.dtype);
  write_npy(p + "x.npy", in.x.data(), xd, {o.tokens, o.hidden}, es);
  write_npy(p + "topk_idx.npy", in.idx.data(), "<i8", {o.tokens, o.topk}, 8);
  write_npy(p + "topk_weights.npy", in.w.data(), "<f4", {o.tokens, o.topk}, 4);
  std::vector<int64_t> xs(r.recv_x.shape.begin(), r.recv_x.shape.begin() + r.recv_x.ndim);
  write_npy(p + "recv_x.npy", r.recv_x.data, xd, xs, es);
  std::vector<int64_t> ss(r.recv_src.shape.begin(), r.recv_src.shape.begin() + r.recv_src.ndim);
  write_npy(p + "recv_src.npy", r.recv_src.data, "<i8", ss, 8);
  if (r.layout == Layout::kThroughput) {
    write_npy(p + "recv_topk_idx.npy", r.recv_topk_idx.data, "<i4", {r.num_recv_rows, o.topk}, 4);
    write_npy(p + "recv_topk_weights.npy", r.recv_topk_weights.data, "<f4",
              {r.num_recv_rows, o.topk}, 4);
  }
  write_npy(p + "recv_count.npy", r.recv_count.data, "<i8", {r.recv_count.dim(0)}, 8);
  if (r.recv_range.data) {
    std::vector<int64_t> rs(r.recv_range.shape.begin(),
                            r.recv_range.shape.begin() + r.recv_range.ndim);
    write_npy(p + "recv_range.npy", r.recv_range.data, "<i8", rs, 8);
  }
  write_npy(p + "combine_in.npy", r.recv_x.data, xd, xs, es);  // identity expert
  write_npy(p + "y.npy", y.data, xd, {y.dim(0), y.dim(1)}, es);
  if (g.rank() == 0) {
    std::ofstream m(o.dump + "/meta.json");
    m << "{\"ranks\": " << g.size() << ", \"tokens\": " << o.tokens << ", \"hidden\": " << o.hidden
      << ", \"topk\": " << o.topk << ", \"experts\": " << o.experts << ", \"dtype\": \""
      << dtype_name(o.dtype) << "\", \"bf16_as\": \"uint16 bit patterns\", \"layout\": \""
      << layout_name(o.layout) << "\", \"impl\": \"" << impl
      << "\", \"expert\": \"identity (combine_in = recv_x)\""
      << ", \"placement\": \"" << placement_name(r.placement) << "\""
      << ", \"rows_per_source\": "
      << (r.layout == Layout::kLatency ? r.recv_x.dim(1) / g.size() : o.tokens)
      << ", \"latency_layout_rows\": \"compact: recv_x[e, :recv_count[e]]; per-source: "
         "recv_x[e, s*rows_per_source : s*rows_per_source + recv_range[e, s, 1]]\"}\n";
  }
}

}  // namespace ubep::tools
