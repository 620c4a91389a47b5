// The data path's row message (backend::RowMessage, DataPath::put_message): a dispatch row's
// payload, scales and metadata pieces in one call. The CPU backend's own implementation against
// the interface's default (the parts put one by one), and its ordering before the row's tag
// under concurrency.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_data_path.hpp"
#include "backend/cpu/row_kernels.hpp"
#include "data_path_stress.hpp"

namespace ubep::test {
namespace {

// One message's parts written into a guard-filled region, at every offset of the scales within
// a line, streamed and not, with 0-3 pieces of the sizes a dispatch uses (4: a latency record's
// token; 16, 32: a throughput row's source and topk 8's ids and weights) and odd ones (12, 40),
// and write hints for other lines: the CPU backend's bytes equal the default's, which puts each
// part with put_row and put and ignores the hints.
TEST(RowMessage, TheCpuBackendWritesWhatThePartsWould) {
  std::mt19937 rng(11);
  std::vector<char> src(8192);
  for (char& c : src) c = static_cast<char>(rng());
  constexpr size_t kRegion = 12288;
  alignas(64) static char got[kRegion], want[kRegion];
  cpu::CpuDataPath dp(0);
  const size_t piece_sizes[] = {4, 16, 32, 12, 40};
  int cases = 0;
  for (bool stream : {false, true})
    for (size_t payload : {size_t{7168}, size_t{4000}})
      for (size_t scales : {size_t{0}, size_t{224}, size_t{56}})
        for (size_t offset = 0; offset < 64; offset += 8)
          for (int pieces = 0; pieces <= backend::RowMessage::kMaxPieces; ++pieces) {
            auto message = [&](char* base) {
              backend::RowMessage m;
              m.payload_dst = base + 64;
              m.payload = src.data();
              m.payload_bytes = payload;
              m.scale_bytes = scales;
              if (scales) {
                m.scale_dst = base + 8192 + offset;
                m.scales = src.data() + 100;
              }
              m.stream = stream;
              for (int i = 0; i < pieces; ++i) {
                m.add(base + 9000 + static_cast<size_t>(i) * 100 + offset, src.data() + 300 + i,
                      piece_sizes[(static_cast<size_t>(i) + offset / 8) % std::size(piece_sizes)]);
                m.writes_soon(base + 10000 + static_cast<size_t>(i) * 64);  // a hint only
              }
              return m;
            };
            std::memset(got, 0x5a, kRegion);
            std::memset(want, 0x5a, kRegion);
            dp.put_message(message(got));
            dp.backend::DataPath::put_message(message(want));
            kernels::store_fence();
            ASSERT_EQ(std::memcmp(got, want, kRegion), 0)
                << "stream " << stream << " payload " << payload << " scales " << scales
                << " offset " << offset << " pieces " << pieces;
            ++cases;
          }
  EXPECT_EQ(cases, 2 * 2 * 3 * 8 * (backend::RowMessage::kMaxPieces + 1));
}

// How the CPU backend orders a streamed message before its tag: it holds the tag back until one
// fence covers the batch (the role's end here), where a message of plain stores (ordered by the
// CPU) lets its tag go at once. Seen from the same thread with a plain look at the tag word.
TEST(RowMessage, AStreamedMessageHoldsItsTagForTheBatchFence) {
  cpu::CpuDataPath dp(0);
  alignas(64) static char dst[2][1024], src[1024], meta[2][64];
  alignas(64) protocol::Tag tag_plain = 0, tag_streamed = 0;
  uint32_t plain_seen = 99, streamed_seen = 99;
  auto look = [](protocol::Tag& t) { return std::atomic_ref<protocol::Tag>(t).load(); };
  dp.run_roles([&](int) {
    for (int streamed = 0; streamed < 2; ++streamed) {
      backend::RowMessage m;
      m.payload_dst = dst[streamed];
      m.payload = src;
      m.payload_bytes = sizeof src;
      m.stream = streamed == 1;
      m.add(meta[streamed], src, 16);
      dp.put_message(m);
      protocol::Tag& tag = streamed ? tag_streamed : tag_plain;
      dp.publish(&tag, 7, false);
      (streamed ? streamed_seen : plain_seen) = look(tag);
    }
  });
  EXPECT_EQ(plain_seen, 7u) << "a plain message's tag was held back";
  EXPECT_EQ(streamed_seen, 0u) << "a streamed message's tag went out before a fence";
  EXPECT_EQ(look(tag_streamed), 7u) << "the role's end did not release the held tag";
}

// A team (3 members) writes messages -- streamed payload, an fp8 row's 224 bytes of scales
// (partial lines shared with neighbours that other members write), three plain pieces into
// arrays of many rows' metadata -- and publishes each row's tag, as a prefill dispatch does;
// a reader on another thread checks every part behind each tag (run_epochs). A part that is not
// ordered before its tag (a streamed store not yet fenced when the held-back tags are released) is
// seen stale.
TEST(RowMessageStress, EveryPartIsVisibleWhenTheTagIs) {
  for (bool stream : {true, false}) {
    constexpr int kMembersRows = 29, kEpochs = 200;
    constexpr size_t kPayload = 1024, kScales = 224, kIds = 32, kSource = 16;
    cpu::CpuDataPath writer(2);
    alignas(64) static char payload[87][kPayload], scales[87][kScales], ids[87][kIds],
        weights[87][kIds], source[87][kSource];
    ASSERT_LE(writer.members() * kMembersRows, 87);
    std::vector<protocol::Tag> tags;
    auto byte = [](uint32_t e, int i, int part) {
      return static_cast<char>(e * 31 + static_cast<uint32_t>(i) * 7 + static_cast<uint32_t>(part));
    };
    auto all = [](const char* p, size_t n, char v) {
      for (size_t b = 0; b < n; ++b)
        if (p[b] != v) return false;
      return true;
    };
    const EpochStress r = run_epochs(
        writer, kMembersRows, kEpochs, tags,
        [&](uint32_t e, int, int i) {
          char parts[5][kPayload];
          for (int p = 0; p < 5; ++p) std::memset(parts[p], byte(e, i, p), kPayload);
          backend::RowMessage msg;
          msg.payload_dst = payload[i];
          msg.payload = parts[0];
          msg.payload_bytes = kPayload;
          msg.scale_dst = scales[i];
          msg.scales = parts[1];
          msg.scale_bytes = kScales;
          msg.stream = stream;
          msg.add(ids[i], parts[2], kIds);
          msg.add(weights[i], parts[3], kIds);
          msg.add(source[i], parts[4], kSource);
          writer.put_message(msg);
        },
        [&](uint32_t e, int i) {
          return all(payload[i], kPayload, byte(e, i, 0)) &&
                 all(scales[i], kScales, byte(e, i, 1)) && all(ids[i], kIds, byte(e, i, 2)) &&
                 all(weights[i], kIds, byte(e, i, 3)) && all(source[i], kSource, byte(e, i, 4));
        });
    EXPECT_TRUE(r.acked) << "stream " << stream << ": the reader never acknowledged an epoch";
    EXPECT_EQ(r.lost, 0) << "stream " << stream << ": a tag never became visible";
    EXPECT_EQ(r.bad, 0) << "stream " << stream << ": a tag was visible before its row";
  }
}

}  // namespace
}  // namespace ubep::test
