// The CPU backend's hot paths checked on their own: the vectorised bf16 reduction against the
// plain fp32 formula (bit for bit, every instruction set the CPU has), and the data path's
// batched fences (rows streamed, tags held back and released) under concurrent readers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_data_path.hpp"
#include "backend/cpu/reduce_bf16.hpp"
#include "backend/cpu/row_kernels.hpp"
#include "data_path_stress.hpp"
#include "ubep/bf16.hpp"

namespace ubep::test {
namespace {

// The definition: a = ((0 + w0*r0) + w1*r1) + ... in fp32, one rounding to bf16 at the end.
std::vector<uint16_t> expected_reduce(const std::vector<std::vector<uint16_t>>& rows,
                                      const float* w, int64_t hidden) {
  std::vector<uint16_t> out(static_cast<size_t>(hidden));
  for (int64_t h = 0; h < hidden; ++h) {
    float a = 0.0f;
    for (size_t r = 0; r < rows.size(); ++r) {
      const float x = bf16_to_float(rows[r][static_cast<size_t>(h)]);
      const float term = w ? w[r] * x : x;
      a = a + term;
    }
    out[static_cast<size_t>(h)] = float_to_bf16(a);
  }
  return out;
}

// Bit for bit, except that any NaN equals any NaN: which NaN comes out when two meet (or when
// Inf - Inf makes one) is not fixed by C++ -- the compiler may commute an addition, and x86
// returns the first operand's NaN -- so the portable kernels do not fix it either.
std::vector<uint32_t> canonical(const std::vector<uint16_t>& v) {
  std::vector<uint32_t> out;
  for (uint16_t x : v) out.push_back((x & 0x7fff) > 0x7f80 ? 0x10000u : x);
  return out;
}

// Values that exercise the rounding: normal numbers of both signs, ties, -0, denormals, Inf,
// NaN, and large values that overflow to Inf when summed.
uint16_t random_bf16(std::mt19937& rng, bool specials) {
  switch (specials ? rng() % 16 : 15) {
    case 0:
      return 0x8000;  // -0
    case 1:
      return 0x0001 + static_cast<uint16_t>(rng() % 0x7f);  // denormal
    case 2:
      return rng() % 2 ? 0x7f80 : 0xff80;  // +-Inf
    case 3:
      return 0x7fc1;  // NaN
    case 4:
      return 0x7f7f;  // the largest finite
    default:
      return float_to_bf16(std::ldexp(static_cast<float>(rng() % 20001) / 10000.0f - 1.0f,
                                      static_cast<int>(rng() % 40) - 20));
  }
}

// One instance per vector kernel (1 AVX2, 2 AVX-512F, 3 AVX-512 + AVX512_BF16); a kernel this
// CPU lacks is reported skipped, naming it.
class ReduceLevel : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() > kernels::reduce_bf16_level())
      GTEST_SKIP() << "vector kernel level " << GetParam() << " needs "
                   << (GetParam() == 1   ? "AVX2"
                       : GetParam() == 2 ? "AVX-512F"
                                         : "AVX-512 with AVX512_BF16")
                   << "; this CPU has level " << kernels::reduce_bf16_level();
  }
};
INSTANTIATE_TEST_SUITE_P(RowKernels, ReduceLevel, ::testing::Values(1, 2, 3));

TEST_P(ReduceLevel, VectorReductionIsBitIdenticalToTheFormula) {
  std::mt19937 rng(7);
  const int level = GetParam();
  for (int64_t hidden : {1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 200, 7168})
    for (int n : {0, 1, 2, 3, 5, 8, 9})
      for (int mode = 0; mode < 4; ++mode) {
        const bool weighted = mode & 1, specials = mode & 2;  // specials: mostly Inf/NaN
        std::vector<std::vector<uint16_t>> rows(static_cast<size_t>(n));
        std::vector<const void*> ptrs;
        std::vector<float> w;
        for (auto& r : rows) {
          r.resize(static_cast<size_t>(hidden));
          for (auto& v : r) v = random_bf16(rng, specials);
          ptrs.push_back(r.data());
          w.push_back(static_cast<float>(rng() % 1000) / 333.0f - 1.0f);
        }
        const float* wp = weighted ? w.data() : nullptr;
        const auto want = expected_reduce(rows, wp, hidden);
        std::vector<uint16_t> got(static_cast<size_t>(hidden) + 1, 0xABCD);  // + a sentinel
        ASSERT_TRUE(kernels::reduce_bf16_vector(got.data(), hidden, ptrs.data(), wp, n, level));
        EXPECT_EQ(got.back(), 0xABCD) << "wrote past the row";
        got.pop_back();
        ASSERT_EQ(canonical(got), canonical(want))
            << "level " << level << " hidden " << hidden << " n " << n
            << (weighted ? " weighted" : "") << (specials ? " specials" : "");
        // Streamed (non-temporal) output: the same bits once fenced.
        std::vector<uint16_t> streamed_storage(static_cast<size_t>(hidden) + 32);
        uint16_t* streamed = streamed_storage.data();
        while (reinterpret_cast<uintptr_t>(streamed) % 64) ++streamed;
        ASSERT_TRUE(kernels::reduce_bf16_vector(streamed, hidden, ptrs.data(), wp, n, level, true));
        kernels::store_fence();
        ASSERT_EQ(canonical(std::vector<uint16_t>(streamed, streamed + hidden)), canonical(want))
            << "streamed";
        std::vector<uint16_t> dispatched(static_cast<size_t>(hidden));
        kernels::reduce_rows(dispatched.data(), DType::kBF16, hidden, ptrs.data(), wp, n);
        ASSERT_EQ(canonical(dispatched), canonical(want));
        // With the next token's rows as a prefetch hint (more rows than this one, and rows
        // that are this token's own): the same bits.
        std::vector<const void*> next(ptrs.rbegin(), ptrs.rend());
        next.push_back(want.data());
        std::vector<uint16_t> hinted(static_cast<size_t>(hidden) + 1, 0xABCD);
        ASSERT_TRUE(kernels::reduce_bf16_vector(hinted.data(), hidden, ptrs.data(), wp, n, level,
                                                false, {next.data(), n + 1}));
        EXPECT_EQ(hinted.back(), 0xABCD) << "wrote past the row";
        hinted.pop_back();
        ASSERT_EQ(canonical(hinted), canonical(want)) << "with next rows";
        // Without software prefetch (the throughput layout's sequential rows): the same bits.
        std::vector<uint16_t> unhinted(static_cast<size_t>(hidden));
        ASSERT_TRUE(kernels::reduce_bf16_vector(unhinted.data(), hidden, ptrs.data(), wp, n, level,
                                                false, {next.data(), n + 1}, false));
        ASSERT_EQ(canonical(unhinted), canonical(want)) << "without prefetch";
      }
}

// Sums in fp32's denormal range: level 3 rounds with VCVTNE2PS2BF16, which flushes denormal
// inputs to zero, so a vector holding one must take the integer rounding instead. Rows of bf16
// denormals and the smallest normals, weighted by [0.25, 2): most sums are denormal, some normal
// and some zero, in every position of a vector, beside vectors with none.
TEST_P(ReduceLevel, DenormalSumsRoundAsTheFormula) {
  std::mt19937 rng(11);
  const int level = GetParam();
  for (int n : {1, 2, 3, 8})
    for (int trial = 0; trial < 20; ++trial) {
      constexpr int64_t kHidden = 96;  // vectors 0 and 2 tiny values, vector 1 ordinary ones
      std::vector<std::vector<uint16_t>> rows(static_cast<size_t>(n));
      std::vector<const void*> ptrs;
      std::vector<float> w;
      for (auto& r : rows) {
        r.resize(kHidden);
        for (int64_t h = 0; h < kHidden; ++h) {
          const bool tiny = h < 32 || h >= 64;
          const uint16_t magnitude = tiny ? static_cast<uint16_t>(rng() % 0x100)  // to 2^-125
                                          : float_to_bf16(static_cast<float>(rng() % 64));
          r[static_cast<size_t>(h)] = static_cast<uint16_t>(magnitude | (rng() % 2 ? 0x8000 : 0));
        }
        ptrs.push_back(r.data());
        w.push_back(0.25f + static_cast<float>(rng() % 1000) / 571.0f);
      }
      for (const float* wp :
           {static_cast<const float*>(w.data()), static_cast<const float*>(nullptr)}) {
        const auto want = expected_reduce(rows, wp, kHidden);
        std::vector<uint16_t> got(kHidden);
        ASSERT_TRUE(kernels::reduce_bf16_vector(got.data(), kHidden, ptrs.data(), wp, n, level));
        ASSERT_EQ(canonical(got), canonical(want))
            << "level " << level << " n " << n << (wp ? " weighted" : "");
      }
    }
}

// The reduction of `rows`, weighted by w (nullptr: unweighted), by the given kernel level.
std::vector<uint16_t> vector_reduce(const std::vector<std::vector<uint16_t>>& rows, const float* w,
                                    int64_t hidden, int level) {
  std::vector<const void*> ptrs;
  for (const auto& r : rows) ptrs.push_back(r.data());
  std::vector<uint16_t> got(static_cast<size_t>(hidden));
  EXPECT_TRUE(kernels::reduce_bf16_vector(got.data(), hidden, ptrs.data(), w,
                                          static_cast<int>(rows.size()), level));
  return got;
}

// Index and values of the first difference, for a readable failure.
std::string first_difference(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i]) {
      char text[64];
      std::snprintf(text, sizeof text, "element %zu: 0x%04x, want 0x%04x", i, got[i], want[i]);
      return text;
    }
  return "none";
}

// Sums at float_to_bf16's edges, compared bit for bit with NaNs too (the tests above let any NaN
// equal any other): every element has at most one NaN operand, so which NaN comes out is fixed.
// The AVX2 kernel rounds NaN-free calls with a shorter packing that is exact only for the NaNs
// such sums can hold; a NaN weight whose low half is not zero must take the exact path.
TEST_P(ReduceLevel, EdgeSumsAndNaNsRoundExactlyAsTheFormula) {
  const int level = GetParam();
  constexpr int64_t kHidden = 64 + 16 + 7;  // a 64-element step, a 16-element step and a tail
  // Row 0's value and the other rows': unweighted pairs sum to a tie that stays (1 + 2^-8), a
  // tie that rounds up (odd), up into the next exponent, the largest finite plus half and a
  // quarter of its ulp (a tie to Inf; kept), Inf, -0 and an ordinary value.
  const uint16_t pattern[][2] = {{0x3f80, 0x3b80}, {0x3f81, 0x3b80}, {0xbf81, 0xbb80},
                                 {0x3f7f, 0x3b00}, {0x7f7f, 0x7b00}, {0x7f7f, 0x7a80},
                                 {0x7f80, 0x3f80}, {0x8000, 0x8000}, {0x4049, 0x3e4d}};
  constexpr int kPattern = sizeof pattern / sizeof pattern[0];
  const uint16_t nans[] = {0x7fc1, 0x7f81, 0xffc0, 0xff81};  // quiet and signalling, both signs
  const uint32_t nan_weights[] = {0x7fc0ffffu, 0x7fffffffu, 0xff80ffffu, 0x7f800001u};
  for (int n : {1, 2, 3, 8})
    for (int mode = 0; mode < 3; ++mode) {  // unweighted, weights 1, weights in [0.75, 2.9]
      std::vector<std::vector<uint16_t>> rows(static_cast<size_t>(n));
      std::vector<float> w;
      for (int r = 0; r < n; ++r) {
        for (int64_t h = 0; h < kHidden; ++h)
          rows[static_cast<size_t>(r)].push_back(pattern[(h + h / kPattern) % kPattern][r > 0]);
        w.push_back(mode == 1 ? 1.0f : 0.75f + 0.3f * static_cast<float>(r));
      }
      const float* wp = mode == 0 ? nullptr : w.data();
      auto got = vector_reduce(rows, wp, kHidden, level), want = expected_reduce(rows, wp, kHidden);
      ASSERT_EQ(got, want) << "n " << n << " mode " << mode << ": " << first_difference(got, want);
      // One NaN among numbers, at every position of the vectors and the tail.
      for (int64_t at = 0; at < kHidden; ++at)
        for (uint16_t nan : nans) {
          auto with_nan = rows;
          with_nan[static_cast<size_t>(at % n)][static_cast<size_t>(at)] = nan;
          got = vector_reduce(with_nan, wp, kHidden, level);
          want = expected_reduce(with_nan, wp, kHidden);
          ASSERT_EQ(got, want) << "n " << n << " mode " << mode << " NaN 0x" << std::hex << nan
                               << " at " << std::dec << at << ": " << first_difference(got, want);
        }
      if (mode == 0) continue;
      // A NaN weight, whose payload every sum takes: low halves that round differently.
      for (uint32_t bits : nan_weights) {
        auto nan_w = w;
        std::memcpy(&nan_w[static_cast<size_t>(n - 1)], &bits, sizeof bits);
        got = vector_reduce(rows, nan_w.data(), kHidden, level);
        want = expected_reduce(rows, nan_w.data(), kHidden);
        ASSERT_EQ(got, want) << "n " << n << " NaN weight 0x" << std::hex << bits << ": "
                             << first_difference(got, want);
      }
    }
}

TEST(RowKernels, VectorReductionDeclinesWhatItCannotDo) {
  std::vector<uint16_t> row(64, 0x3f80), out(64, 0);
  std::vector<const void*> ptrs(kernels::kMaxVectorRows + 1, row.data());
  EXPECT_FALSE(kernels::reduce_bf16_vector(out.data(), 64, ptrs.data(), nullptr, 1, 0));
  EXPECT_FALSE(kernels::reduce_bf16_vector(out.data(), 64, ptrs.data(), nullptr,
                                           kernels::kMaxVectorRows + 1));
  EXPECT_EQ(out, std::vector<uint16_t>(64, 0));
}

// A streamed copy (whole lines non-temporal, partial end lines plain) writes exactly the span:
// every destination offset within a line and sizes around the line boundaries, against memcpy
// into a copy of the same guard-filled destination.
TEST(RowKernels, StreamedCopyWritesExactlyItsSpanAtEveryAlignment) {
  std::mt19937 rng(7);
  std::vector<char> src(2048);
  for (char& c : src) c = static_cast<char>(rng());
  alignas(64) char dst[2304], want[2304];
  int streamed = 0;
  for (size_t offset = 0; offset < 64; ++offset)
    for (size_t bytes : {size_t{1}, size_t{63}, size_t{64}, size_t{127}, size_t{128}, size_t{224},
                         size_t{1000}, size_t{1024}, size_t{2047}}) {
      std::memset(dst, 0x5a, sizeof dst);
      std::memset(want, 0x5a, sizeof want);
      std::memcpy(want + 64 + offset, src.data(), bytes);
      streamed += kernels::stream_row_to_peer(dst + 64 + offset, src.data(), bytes);
      kernels::store_fence();
      ASSERT_EQ(std::memcmp(dst, want, sizeof dst), 0) << "offset " << offset << " bytes " << bytes;
    }
#if defined(__x86_64__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)  // row_kernels.cpp streams in these builds
  EXPECT_GT(streamed, 0) << "no span took the streaming path";
#endif
}

// Writers (a team of 3 members) stream rows into a shared "window" and complete each with its
// tag, as a dispatch does; a reader on another thread checks every row behind its tag
// (run_epochs, data_path_stress.hpp: member 0 waits for the reader inside its role, so its
// held-back tags must be released before it waits). Row counts are not multiples of the batch.
// Sizes: whole lines (4096), partial lines at both ends of most rows, shared by neighbours that
// other members write (1000; 224, an fp8 row's scales), and no whole line at all (40: plain
// stores only).
TEST(CpuDataPathStress, BatchedFencesReleaseEveryTagAfterItsRow) {
  for (size_t row_bytes : {size_t{4096}, size_t{1000}, size_t{224}, size_t{40}}) {
    constexpr int kMembersRows = 37, kEpochs = 300;
    cpu::CpuDataPath writer(2);
    const int members = writer.members();
    const int rows = members * kMembersRows;
    std::vector<char> storage(static_cast<size_t>(rows) * row_bytes + 64);
    char* window = storage.data() + (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
    std::vector<protocol::Tag> tags;
    auto value = [](uint32_t e, int i) {
      return static_cast<char>(e * 31 + static_cast<uint32_t>(i));
    };
    std::vector<std::vector<char>> src(static_cast<size_t>(members), std::vector<char>(row_bytes));
    const EpochStress r = run_epochs(
        writer, kMembersRows, kEpochs, tags,
        [&](uint32_t e, int m, int i) {
          std::vector<char>& s = src[static_cast<size_t>(m)];
          std::memset(s.data(), value(e, i), row_bytes);
          writer.put_row(window + static_cast<size_t>(i) * row_bytes, s.data(), row_bytes, true);
        },
        [&](uint32_t e, int i) {
          const char* row = window + static_cast<size_t>(i) * row_bytes;
          for (size_t b = 0; b < row_bytes; ++b)
            if (row[b] != value(e, i)) return false;
          return true;
        });
    EXPECT_TRUE(r.acked) << "row " << row_bytes << ": the reader never acknowledged an epoch";
    EXPECT_EQ(r.lost, 0) << "row " << row_bytes << ": a tag never became visible";
    EXPECT_EQ(r.bad, 0) << "row " << row_bytes << ": a tag was visible before its row";
  }
}

// A combine's shape: a team (3 members) waits for each token's input rows behind their tags
// (a tag test with no held tag of its own, which leaves the streamed outputs unfenced), reduces
// them into a shared output with streamed stores, and the caller publishes the output once
// run_roles returns. Another thread writes the inputs, waits for that publication and checks
// every output row. The role's end must fence the streamed rows before the publication: a row
// seen stale or torn fails. Both hint modes (prefetching, sequential), and outputs that are
// and are not whole lines.
TEST(CpuDataPathStress, StreamedReductionsAreVisibleWhenTheOutputIsPublished) {
  for (int64_t hidden : {int64_t{1024}, int64_t{200}}) {
    constexpr int kTokens = 39, kEpochs = 200, kRows = 2;
    cpu::CpuDataPath team(2), other(0);
    const size_t row_elems = static_cast<size_t>(hidden);
    alignas(64) static uint16_t inputs[kTokens * kRows][1024], outputs[kTokens][1024];
    std::vector<protocol::Tag> in_tags(kTokens, 0);
    alignas(64) protocol::Tag out_tag = 0;
    std::atomic<int> bad_rows{0}, lost{0};
    auto value = [](uint32_t e, int token, int row, size_t h) {
      return static_cast<float>((e + static_cast<uint32_t>(token * 3 + row) + h) % 61);
    };
    std::thread producer([&] {
      for (uint32_t e = 1; e <= kEpochs && lost == 0; ++e) {
        for (int t = 0; t < kTokens; ++t) {
          for (int r = 0; r < kRows; ++r)
            for (size_t h = 0; h < row_elems; ++h)
              inputs[t * kRows + r][h] = float_to_bf16(value(e, t, r, h));
          other.publish(&in_tags[static_cast<size_t>(t)], e, false);
        }
        if (!wait_tag(other, &out_tag, e)) {
          lost = 1;
          return;
        }
        for (int t = 0; t < kTokens; ++t)
          for (size_t h = 0; h < row_elems; ++h)
            if (outputs[t][h] != float_to_bf16(value(e, t, 0, h) + value(e, t, 1, h))) {
              ++bad_rows;
              break;
            }
      }
    });
    std::atomic<bool> waited{true};
    for (uint32_t e = 1; e <= kEpochs && waited; ++e) {
      team.run_roles([&](int m) {
        for (int t = m; t < kTokens; t += team.members()) {
          if (!wait_tag(team, &in_tags[static_cast<size_t>(t)], e)) {
            waited = false;
            return;
          }
          const void* rows[kRows] = {inputs[t * kRows], inputs[t * kRows + 1]};
          team.reduce_rows(outputs[t], DType::kBF16, hidden, rows, nullptr, kRows, true, nullptr, 0,
                           /*sequential=*/e % 2 == 0);
        }
      });
      team.publish(&out_tag, e, false);
    }
    producer.join();
    EXPECT_TRUE(waited.load()) << "hidden " << hidden << ": an input tag never became visible";
    EXPECT_EQ(lost.load(), 0) << "hidden " << hidden << ": the output was never published";
    EXPECT_EQ(bad_rows.load(), 0) << "hidden " << hidden << ": an output row was stale";
  }
}

}  // namespace
}  // namespace ubep::test
