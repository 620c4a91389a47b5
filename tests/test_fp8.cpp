// The fp8 e4m3 codec (ubep/fp8.hpp) against the independent reference in fp8_reference.hpp:
// every bf16 bit pattern, random fp32 values, and the block cases the format defines (zeros, the
// amax floor, NaN/Inf, saturation, subnormals, power-of-two scales, a partial last block).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "core/fp8_blocks.hpp"
#include "fp8_reference.hpp"
#include "ubep/error.hpp"
#include "ubep/fp8.hpp"

namespace ubep::test {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(Fp8Codec, DecodesEveryCodeLikeTheFormatDefinition) {
  for (int c = 0; c < 256; ++c) {
    const double want = ref_e4m3_value(c);
    const float got = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;
    }
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
}

TEST(Fp8Codec, EncodesEveryBf16PatternLikeTheReference) {
  for (uint32_t p = 0; p < 65536; ++p) {
    const float v = bf16_to_float(static_cast<uint16_t>(p));
    ASSERT_EQ(float_to_e4m3(v), ref_e4m3_encode(v)) << "bf16 pattern 0x" << std::hex << p;
  }
}

TEST(Fp8Codec, EncodesRandomFloatsAndTiesLikeTheReference) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mag(-12.0f, 10.0f);
  for (int i = 0; i < 200000; ++i) {
    const float v =
        std::ldexp(1.0f + static_cast<float>(rng() % 4096) / 4096.0f, static_cast<int>(mag(rng))) *
        (rng() % 2 ? 1.0f : -1.0f);
    ASSERT_EQ(float_to_e4m3(v), ref_e4m3_encode(v)) << v;
  }
  // Exact midpoints round to the even code: 1 + 1/16 lies between 1 (0x38) and 1.125 (0x39).
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3A);  // between 1.125 (0x39) and 1.25 (0x3A): even
  EXPECT_EQ(float_to_e4m3(std::ldexp(1.0f, -10)), 0x00);      // half the smallest subnormal
  EXPECT_EQ(float_to_e4m3(3 * std::ldexp(1.0f, -10)), 0x02);  // 1.5 subnormal steps: even
}

TEST(Fp8Codec, SaturatesAndMapsNonFiniteValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7E);  // the midpoint to the (absent) 480
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7E);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xFE);
  EXPECT_EQ(float_to_e4m3(inf), 0x7E);
  EXPECT_EQ(float_to_e4m3(-inf), 0xFE);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::denorm_min()), 0x00);
}

// Quantizes rows with the library (from fp32 and from bf16) and with the reference; codes and
// scales must match bit for bit.
void expect_rows_match(const std::vector<float>& x, int64_t rows, int64_t hidden, bool pow2) {
  const RefFp8 want = ref_fp8_quantize(x, rows, hidden, pow2);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(want.scales.size());
  fp8_quantize_rows(x.data(), DType::kFP32, rows, hidden, pow2, codes.data(), scales.data());
  EXPECT_EQ(codes, want.codes);
  for (size_t i = 0; i < scales.size(); ++i)
    EXPECT_EQ(bits(scales[i]), bits(want.scales[i])) << "scale " << i;
}

std::vector<float> random_rows(int64_t rows, int64_t hidden, uint64_t seed, float spread) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, spread);
  std::vector<float> x(static_cast<size_t>(rows * hidden));
  for (float& v : x) v = d(rng);
  return x;
}

TEST(Fp8Codec, QuantizesBlocksLikeTheReference) {
  for (bool pow2 : {false, true}) {
    SCOPED_TRACE(pow2 ? "pow2 scales" : "exact scales");
    expect_rows_match(random_rows(5, 512, 1, 1.0f), 5, 512, pow2);
    expect_rows_match(random_rows(3, 7168, 2, 30.0f), 3, 7168, pow2);
    expect_rows_match(random_rows(2, 200, 3, 0.01f), 2, 200, pow2);  // partial last block
    expect_rows_match(random_rows(2, 5, 4, 1.0f), 2, 5, pow2);       // one short block
  }
}

TEST(Fp8Codec, ZerosAndTheAmaxFloor) {
  std::vector<float> zeros(256, 0.0f);
  std::vector<uint8_t> codes(256, 0xAA);
  float scales[2];
  fp8_quantize_rows(zeros.data(), DType::kFP32, 1, 256, false, codes.data(), scales);
  EXPECT_EQ(scales[0], 1e-4f / 448.0f);
  EXPECT_EQ(codes, std::vector<uint8_t>(256, 0));
  // Values below the floor: the scale stays at the floor's, so they encode small.
  std::vector<float> tiny(128, 1e-6f);
  tiny[3] = -2e-5f;
  expect_rows_match(tiny, 1, 128, false);
  fp8_quantize_rows(tiny.data(), DType::kFP32, 1, 128, false, codes.data(), scales);
  EXPECT_EQ(scales[0], 1e-4f / 448.0f);
  EXPECT_EQ(codes[3], ref_e4m3_encode(-2e-5f * (448.0f / 1e-4f)));
}

TEST(Fp8Codec, NonFiniteValuesDoNotSetTheScale) {
  std::vector<float> x = random_rows(1, 256, 5, 2.0f);
  x[7] = std::numeric_limits<float>::infinity();
  x[9] = -std::numeric_limits<float>::infinity();
  x[130] = std::numeric_limits<float>::quiet_NaN();
  expect_rows_match(x, 1, 256, false);
  std::vector<uint8_t> codes(256);
  float scales[2];
  fp8_quantize_rows(x.data(), DType::kFP32, 1, 256, false, codes.data(), scales);
  EXPECT_EQ(codes[7], 0x7E);  // Inf saturates to +-448 * scale
  EXPECT_EQ(codes[9], 0xFE);
  EXPECT_EQ(codes[130], 0x7F);  // NaN stays NaN
  EXPECT_TRUE(std::isfinite(scales[0]) && std::isfinite(scales[1]));
  EXPECT_LT(scales[0], 1.0f);
}

TEST(Fp8Codec, SubnormalCodesAndPowerOfTwoScales) {
  // One large value sets the scale; the rest fall in e4m3's subnormal range.
  std::vector<float> x(128, 0.0f);
  x[0] = 448.0f;
  for (int i = 1; i < 128; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i) * 1e-4f;
  expect_rows_match(x, 1, 128, false);
  expect_rows_match(x, 1, 128, true);
  std::vector<uint8_t> codes(128);
  float scale;
  fp8_quantize_rows(x.data(), DType::kFP32, 1, 128, false, codes.data(), &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(codes[10] & 0x78, 0);  // 1e-3: exponent field 0, a subnormal
  EXPECT_NE(codes[10], 0);
  // Power-of-two scales: amax 3 -> 3/448 rounds up to 2^-7.
  x.assign(128, 1.0f);
  x[0] = 3.0f;
  fp8_quantize_rows(x.data(), DType::kFP32, 1, 128, true, codes.data(), &scale);
  EXPECT_EQ(scale, std::ldexp(1.0f, -7));
  EXPECT_EQ(e4m3_to_float(codes[0]), 384.0f);               // 3 * 128, exact
  EXPECT_EQ(fp8_block_scale(448.0f * 0.25f, true), 0.25f);  // already a power of two: kept
}

TEST(Fp8Codec, Bf16InputMatchesAndRoundTripsWithinHalfAStep) {
  const int64_t rows = 4, hidden = 300;
  std::vector<float> x = random_rows(rows, hidden, 9, 3.0f);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = float_to_bf16(x[i]);
    x[i] = bf16_to_float(xb[i]);
  }
  const RefFp8 want = ref_fp8_quantize(x, rows, hidden, false);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(want.scales.size()), back(x.size());
  fp8_quantize_rows(xb.data(), DType::kBF16, rows, hidden, false, codes.data(), scales.data());
  EXPECT_EQ(codes, want.codes);
  fp8_dequantize_rows(codes.data(), scales.data(), rows, hidden, back.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < hidden; ++h) {
      const size_t i = static_cast<size_t>(r * hidden + h);
      const float scale = scales[static_cast<size_t>(r * want.blocks + h / 128)];
      // 3 mantissa bits: half a step is 2^-4 of the value, or 2^-10 * scale when subnormal.
      const float tol = std::max(std::fabs(x[i]) / 16.0f, std::ldexp(scale, -10));
      EXPECT_LE(std::fabs(back[i] - x[i]), tol) << "row " << r << " channel " << h;
    }
}

// Every vector level this CPU has (AVX2, AVX-512F) against the portable kernels and the
// reference, bit for bit: every bf16 pattern (in order, and shuffled so that each block mixes
// magnitudes, NaN and Inf), random fp32 blocks with both scale kinds, and every code decoded
// under scales from tiny to huge.
class Fp8VectorKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (fp8_blocks::best_level() == fp8_blocks::kPortable)
      GTEST_SKIP() << "this CPU has neither AVX2 nor AVX-512F";
  }
  static std::vector<int> levels() {
    std::vector<int> l;
    for (int level = fp8_blocks::kAvx2; level <= fp8_blocks::best_level(); ++level)
      l.push_back(level);
    return l;
  }
  static void expect_same_quantization(const void* src, bool bf16, int64_t rows, int64_t hidden,
                                       bool pow2) {
    const int64_t blocks = fp8_scales_per_row(hidden);
    for (int level : levels()) {
      SCOPED_TRACE(level);
      std::vector<uint8_t> cv(static_cast<size_t>(rows * hidden)), cs(cv.size());
      std::vector<float> sv(static_cast<size_t>(rows * blocks)), ss(sv.size());
      fp8_blocks::quantize_rows(src, bf16, rows, hidden, pow2, cv.data(), sv.data(), level);
      fp8_blocks::quantize_rows(src, bf16, rows, hidden, pow2, cs.data(), ss.data(),
                                fp8_blocks::kPortable);
      ASSERT_EQ(cv, cs);
      for (size_t i = 0; i < sv.size(); ++i) ASSERT_EQ(bits(sv[i]), bits(ss[i])) << "scale " << i;
    }
  }
};

TEST_F(Fp8VectorKernels, QuantizeEveryBf16PatternLikeThePortableKernelAndTheReference) {
  std::vector<uint16_t> patterns(65536);
  std::iota(patterns.begin(), patterns.end(), uint16_t{0});
  std::vector<uint16_t> shuffled = patterns;
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(11));
  for (const auto* p : {&patterns, &shuffled})
    for (bool pow2 : {false, true}) {
      expect_same_quantization(p->data(), true, 512, 128, pow2);
      std::vector<float> x(p->size());
      for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float((*p)[i]);
      const RefFp8 want = ref_fp8_quantize(x, 512, 128, pow2);
      for (int level : levels()) {
        std::vector<uint8_t> codes(x.size());
        std::vector<float> scales(want.scales.size());
        fp8_blocks::quantize_rows(p->data(), true, 512, 128, pow2, codes.data(), scales.data(),
                                  level);
        ASSERT_EQ(codes, want.codes) << "level " << level;
        for (size_t i = 0; i < scales.size(); ++i)
          ASSERT_EQ(bits(scales[i]), bits(want.scales[i])) << "scale " << i;
      }
    }
}

TEST_F(Fp8VectorKernels, QuantizeRandomFp32RowsLikeThePortableKernel) {
  for (bool pow2 : {false, true})
    for (float spread : {1e-6f, 0.01f, 1.0f, 300.0f, 1e30f}) {
      SCOPED_TRACE(spread);
      std::vector<float> x = random_rows(6, 7168 + 77, 13, spread);  // partial last block too
      x[5] = std::numeric_limits<float>::infinity();
      x[300] = -std::numeric_limits<float>::quiet_NaN();
      x[901] = 1.0625f;  // ties
      x[902] = -1.1875f;
      expect_same_quantization(x.data(), false, 6, 7168 + 77, pow2);
    }
}

// The AVX2 encoder's short path covers magnitudes up to 464 (the normal branch's code there is
// the saturated 0x7e): every fp32 value around that bound, the block's other lanes normal, and
// the values just past it, which must take the full encoding (0x7e, not the 0x7f NaN code).
TEST_F(Fp8VectorKernels, EncodesAroundTheSaturationBoundLikeTheReference) {
  std::vector<float> around;
  for (float v = 440.0f; v <= 480.0f; v = std::nextafter(v, 1e9f)) around.push_back(v);
  for (size_t at = 0; at < around.size(); at += 64) {
    std::vector<float> block(kFp8BlockSize, 1.5f);
    for (size_t i = 0; i < 64 && at + i < around.size(); ++i)
      block[2 * i] = (i % 3 == 0 ? -1.0f : 1.0f) * around[at + i];
    for (float inv : {1.0f, 0.5f}) {
      std::vector<uint8_t> codes(kFp8BlockSize);
      fp8_blocks::encode_block_avx2(block.data(), false, inv, codes.data());
      for (size_t i = 0; i < block.size(); ++i)
        ASSERT_EQ(codes[i], float_to_e4m3(block[i] * inv)) << block[i] << " x " << inv;
    }
  }
}

// bf16 blocks whose values span up to 2^16 below their amax, with random signs: the AVX2
// quantizer's normal-range encoder takes the blocks whose smallest value, scaled, is at least
// 2^-6 and the general one the rest; blocks placed exactly at that bound and one step under it.
TEST_F(Fp8VectorKernels, QuantizesBf16BlocksAcrossTheNormalRangeLikeThePortableKernel) {
  std::mt19937 rng(41);
  const int64_t blocks = 3000;
  std::vector<uint16_t> x(static_cast<size_t>(blocks * kFp8BlockSize));
  for (int64_t b = 0; b < blocks; ++b) {
    const float top = std::ldexp(1.0f, static_cast<int>(rng() % 41) - 20);
    const float span = static_cast<float>(rng() % 17);  // binades below the top
    for (int64_t i = 0; i < kFp8BlockSize; ++i) {
      const float e = -span * static_cast<float>(rng() % 10001) / 10000.0f;
      const float v = top * std::exp2(e) * (rng() % 2 ? -1.0f : 1.0f);
      x[static_cast<size_t>(b * kFp8BlockSize + i)] = float_to_bf16(v);
    }
  }
  // The amax 448 (scale 1) and a lane of 2^-6, or the bf16 value just under it.
  for (int64_t b : {int64_t{0}, int64_t{1}}) {
    uint16_t* block = &x[static_cast<size_t>(b * kFp8BlockSize)];
    block[5] = float_to_bf16(448.0f);
    for (int64_t i = 0; i < kFp8BlockSize; ++i)
      if (i != 5) block[i] = float_to_bf16(i % 2 ? 1.0f : -3.0f);
    block[77] = static_cast<uint16_t>(float_to_bf16(0.015625f) - b);
  }
  for (bool pow2 : {false, true}) expect_same_quantization(x.data(), true, 100, 30 * 128, pow2);
}

// quantize_rows takes full blocks several at a time (amax and scale of each first): row widths
// whose full blocks do not fill the last group, blocks with zeros or one NaN/Inf lane among
// normal values, and bf16 sources, bit for bit against the portable kernel.
TEST_F(Fp8VectorKernels, QuantizeRowsOfUnevenBlockCountsAndMixedLanes) {
  for (int64_t hidden : {int64_t{128}, int64_t{128 * 3}, int64_t{128 * 11 + 5}, int64_t{128 * 17}})
    for (bool pow2 : {false, true}) {
      SCOPED_TRACE(hidden);
      std::vector<float> x = random_rows(5, hidden, 29 + static_cast<uint64_t>(hidden), 2.0f);
      x[1] = 0.0f;  // one zero lane in an otherwise normal block
      x[static_cast<size_t>(hidden) + 40] = std::numeric_limits<float>::infinity();
      x[static_cast<size_t>(2 * hidden) + 7] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t i = 0; i < 128; ++i) x[static_cast<size_t>(3 * hidden + i)] = 0.0f;
      expect_same_quantization(x.data(), false, 5, hidden, pow2);
      std::vector<uint16_t> xb(x.size());
      for (size_t i = 0; i < x.size(); ++i) xb[i] = float_to_bf16(x[i]);
      expect_same_quantization(xb.data(), true, 5, hidden, pow2);
    }
}

TEST_F(Fp8VectorKernels, DequantizeEveryCodeLikeThePortableKernelAndTheReference) {
  std::vector<uint8_t> codes(2 * 128);
  std::iota(codes.begin(), codes.end(), uint8_t{0});
  for (float scale : {1.0f, std::ldexp(1.0f, -7), 1e-4f / 448.0f, 3.7f, 1e30f, 2.3e-38f}) {
    SCOPED_TRACE(scale);
    const float scales[2] = {scale, scale};
    for (int level : levels()) {
      SCOPED_TRACE(level);
      std::vector<float> vec(codes.size()), port(codes.size());
      fp8_blocks::dequantize_rows(codes.data(), scales, 1, 256, vec.data(), level);
      fp8_blocks::dequantize_rows(codes.data(), scales, 1, 256, port.data(), fp8_blocks::kPortable);
      for (size_t c = 0; c < codes.size(); ++c) {
        ASSERT_EQ(bits(vec[c]), bits(port[c])) << "code " << c;
        const double want = ref_e4m3_value(static_cast<int>(c));
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(vec[c])) << "code " << c;
        } else {
          EXPECT_EQ(vec[c], static_cast<float>(want) * scale) << "code " << c;
        }
      }
    }
  }
}

TEST(Fp8Codec, RejectsBadSources) {
  float f = 0;
  uint8_t c;
  EXPECT_THROW(fp8_quantize_rows(&f, DType::kInt32, 1, 1, false, &c, &f), InvalidArgument);
  EXPECT_THROW(fp8_quantize_rows(&f, DType::kFP32, 1, 0, false, &c, &f), InvalidArgument);
  EXPECT_EQ(fp8_scales_per_row(7168), 56);
  EXPECT_EQ(fp8_scales_per_row(200), 2);
  EXPECT_EQ(parse_dtype("fp8"), DType::kFP8E4M3);
  EXPECT_EQ(dtype_size(DType::kFP8E4M3), 1u);
}

}  // namespace
}  // namespace ubep::test
