// The ubep algorithm: decomposed, barrier-free dispatch and combine.
//
// Roles (run concurrently by the rank's WorkerTeam; member 0 is the caller):
//  * token senders: every member writes a slice of each destination's token records;
//  * count sender: member 0 writes one count record to every destination, before its tokens
//    (counts travel with the data, never in a round of their own);
//  * prefix sum: member 0 waits for the count records, computes the output offsets and raises
//    the point-to-point signal `prefix_ready` (the one real dependency; no barrier);
//  * reorderers: every member consumes records of its slice as they arrive (streaming).
//
// Completion is data-as-flag: each record ends with the call's epoch tag (protocol.hpp), or, in
// the stop-and-wait ablation, a separate flag written after a full fence.
//
// Why no buffer is ever cleaned and a fast rank can never overwrite what a slow rank reads:
// call n writes the staging half n%2 of its receivers. A sender S starts call n only after it
// has finished call n-1, whose receive side waited for the count record of call n-1 from every
// rank R. R writes that record at the start of its call n-1, i.e. after R finished call n-2 --
// the last call that read half n%2 on R. So when S writes R's half n%2 in call n, R is done
// reading it. Combine for dispatch n uses combine half n%2 and the same chain (R sends its
// dispatch n count record only after finishing combine n-2). Tags differ between calls of the
// same half, so stale records are never mistaken for new ones. This needs each rank to finish
// its calls in order, which the Buffer enforces (one outstanding split-phase call).
#include <atomic>

#include "core/stage_timer.hpp"
#include "ep/buffer_impl.hpp"

namespace ubep::ep {

namespace {

// [begin, end) of member m's share of n items split into `members` equal slices.
inline void slice(int64_t n, int m, int members, int64_t* begin, int64_t* end) {
  *begin = n * m / members;
  *end = n * (m + 1) / members;
}

// Marks a filled message complete, in the buffer's sync mode.
inline void complete(const Buffer::Impl& b, Tag* fused_tag, Tag* separate_flag) {
  if (b.cfg.sync == SyncMode::kFused) {
    publish(fused_tag, b.tag());
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);  // the fence of stop-and-wait
    publish(separate_flag, b.tag());
  }
}

inline bool is_complete(const Buffer::Impl& b, const Tag* fused_tag, const Tag* separate_flag) {
  return arrived(b.cfg.sync == SyncMode::kFused ? fused_tag : separate_flag, b.tag());
}

}  // namespace

void ubep_dispatch_send(Buffer::Impl& b, const DispatchArgs& a) {
  StageTimer timer(b.stats);
  const int members = b.team->size();
  b.team->run([&](int m) {
    // Destinations in rotated order, starting after ourselves, so senders spread over receivers.
    if (m == 0) {
      for (int k = 1; k <= b.ranks; ++k) {
        const int d = (b.rank + k) % b.ranks;
        CountRecord rec = b.fill_count(d);
        complete(b, rec.tag(), b.staging.count_flag(b.peer(d), b.half(), b.rank));
      }
    }
    for (int k = 1; k <= b.ranks; ++k) {
      const int d = (b.rank + k) % b.ranks;
      int64_t i0, i1;
      slice(b.routing.dest_rows[static_cast<size_t>(d)], m, members, &i0, &i1);
      for (int64_t i = i0; i < i1; ++i) {
        TokenRecord rec = b.fill_token(a, d, i);
        complete(b, rec.tag(), b.staging.token_flag(b.peer(d), b.half(), b.rank, i));
      }
    }
  });
  timer.lap("send");
}

void ubep_dispatch_recv(Buffer::Impl& b) {
  const uint64_t signal = b.seq + 1;
  const int members = b.team->size();
  const double send_us = b.stats.stage_us.empty() ? 0.0 : b.stats.stage_us.back().second;
  StageTimer timer(b.stats);
  b.team->run([&](int m) {
    if (m == 0) {
      for (int s = 0; s < b.ranks; ++s) {
        CountRecord rec = b.staging.count(b.local(), b.half(), s);
        const Tag* flag = b.staging.count_flag(b.local(), b.half(), s);
        wait_until([&] { return is_complete(b, rec.tag(), flag); }, b.wait,
                   [&] { return detail::concat("count record of rank ", s, " (epoch tag ", b.tag(), ")"); });
      }
      b.prefix_sum();
      b.prefix_ready.store(signal, std::memory_order_release);
    } else {
      wait_until([&] { return b.prefix_ready.load(std::memory_order_acquire) == signal; }, b.wait,
                 [] { return std::string("the prefix-sum role"); });
    }
    // Stream: poll every source, consume whatever has arrived, in slot order per source.
    int64_t* cursor = &b.cursors[static_cast<size_t>(m) * static_cast<size_t>(b.ranks)];
    int64_t remaining = 0;
    for (int s = 0; s < b.ranks; ++s) {
      int64_t i0, i1;
      slice(b.src_rows[static_cast<size_t>(s)], m, members, &i0, &i1);
      cursor[s] = i0;
      remaining += i1 - i0;
    }
    auto progress = [&] {
      for (int s = 0; s < b.ranks; ++s) {
        int64_t i0, i1;
        slice(b.src_rows[static_cast<size_t>(s)], m, members, &i0, &i1);
        while (cursor[s] < i1) {
          const int64_t i = cursor[s];
          TokenRecord rec = b.staging.token(b.local(), b.half(), s, i);
          if (!is_complete(b, rec.tag(), b.staging.token_flag(b.local(), b.half(), s, i))) break;
          b.consume_token(s, i);
          ++cursor[s];
          --remaining;
        }
      }
      return remaining == 0;
    };
    wait_until(progress, b.wait, [&] {
      for (int s = 0; s < b.ranks; ++s) {
        int64_t i0, i1;
        slice(b.src_rows[static_cast<size_t>(s)], m, members, &i0, &i1);
        if (cursor[s] < i1)
          return detail::concat("token record ", cursor[s], " of ", b.src_rows[static_cast<size_t>(s)],
                                " from rank ", s);
      }
      return std::string("token records");
    });
  });
  b.stats.stage_us.insert(b.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive + reorder");
}

void ubep_combine_send(Buffer::Impl& b, const CombineArgs& a) {
  StageTimer timer(b.stats);
  const int members = b.team->size();
  const int64_t rows = b.combine_row_count();
  b.team->run([&](int m) {
    int64_t r0, r1;
    slice(rows, m, members, &r0, &r1);
    for (int64_t row = r0; row < r1; ++row) {
      int owner;
      int64_t slot;
      const char* data;
      b.combine_target(row, &owner, &slot, &data, a);
      if (owner < 0) continue;
      CombineRecord rec = b.staging.combine(b.peer(owner), b.half(), slot);
      std::memcpy(rec.row(), data, b.row_bytes());
      complete(b, rec.tag(), b.staging.combine_flag(b.peer(owner), b.half(), slot));
    }
  });
  timer.lap("send");
}

void ubep_combine_recv(Buffer::Impl& b) {
  const int members = b.team->size();
  const double send_us = b.stats.stage_us.empty() ? 0.0 : b.stats.stage_us.back().second;
  StageTimer timer(b.stats);
  b.team->run([&](int m) {
    float* acc = &b.acc[static_cast<size_t>(m) * static_cast<size_t>(b.cfg.hidden)];
    int64_t t0, t1;
    slice(b.routing.num_tokens, m, members, &t0, &t1);
    for (int64_t t = t0; t < t1; ++t) {
      b.reduce_token(t, acc, [&](int64_t slot, int from) {
        CombineRecord rec = b.staging.combine(b.local(), b.half(), slot);
        const Tag* flag = b.staging.combine_flag(b.local(), b.half(), slot);
        wait_until([&] { return is_complete(b, rec.tag(), flag); }, b.wait, [&] {
          return detail::concat("combine row of token ", t, " from rank ", from, " (epoch tag ", b.tag(), ")");
        });
      });
    }
  });
  b.stats.stage_us.insert(b.stats.stage_us.begin(), {"send", send_us});
  timer.lap("receive + reduce");
}

}  // namespace ubep::ep
