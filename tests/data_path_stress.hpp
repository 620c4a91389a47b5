// Helpers of the CPU data path's ordering tests (test_cpu_backend.cpp, test_row_messages.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_data_path.hpp"

namespace ubep::test {

// A bounded wait on a tag for a thread outside the data path's roles (20 s, then false).
inline bool wait_tag(const cpu::CpuDataPath& dp, const protocol::Tag* tag, uint32_t value) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (unsigned spin = 0; !dp.arrived(tag, value); ++spin)
    if (spin % 64 == 0) {
      if (std::chrono::steady_clock::now() > give_up) return false;
      std::this_thread::yield();
    }
  return true;
}

struct EpochStress {
  bool acked = true;  // the reader acknowledged every epoch
  int lost = 0;       // 1 + the row whose tag never became visible, or 0
  int bad = 0;        // rows seen stale behind their tag
};

// Writers and a reader, as a dispatch's senders and receiver: in each epoch e (from 1) every
// member m of `writer` writes its rows i in [m * per_member, (m + 1) * per_member) with
// write(e, m, i) and publishes tags[i] = e; a reader thread waits for every tag in turn and checks
// the row behind it (check(e, i): false if stale), then acknowledges the epoch. Member 0 waits
// for that acknowledgement inside its role, so its held-back tags must be released before it
// waits (else the reader never sees them and the wait times out); the other members' tags are
// released when their role ends. `acked` is written by member 0 and read after run_roles
// returns (which orders every member's writes before it).
template <typename Write, typename Check>
EpochStress run_epochs(cpu::CpuDataPath& writer, int per_member, uint32_t epochs,
                       std::vector<protocol::Tag>& tags, Write&& write, Check&& check) {
  cpu::CpuDataPath reader_dp(0);
  const int rows = writer.members() * per_member;
  tags.assign(static_cast<size_t>(rows), 0);
  alignas(64) protocol::Tag ack = 0;
  std::atomic<int> bad{0}, lost{0};
  std::thread reader([&] {
    for (uint32_t e = 1; e <= epochs && lost == 0; ++e) {
      for (int i = 0; i < rows; ++i) {
        if (!wait_tag(reader_dp, &tags[static_cast<size_t>(i)], e)) {
          lost = i + 1;
          return;
        }
        if (!check(e, i)) ++bad;
      }
      reader_dp.publish(&ack, e, false);
    }
  });
  EpochStress out;
  for (uint32_t e = 1; e <= epochs && out.acked; ++e) {
    writer.run_roles([&](int m) {
      for (int i = m * per_member; i < (m + 1) * per_member; ++i) {
        write(e, m, i);
        writer.publish(&tags[static_cast<size_t>(i)], e, false);
      }
      if (m == 0 && !wait_tag(writer, &ack, e)) out.acked = false;
    });
  }
  reader.join();
  out.lost = lost.load();
  out.bad = bad.load();
  return out;
}

}  // namespace ubep::test
