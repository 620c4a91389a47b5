// Message formats and epoch tags shared by the algorithms (the protocol, kept apart from the
// algorithms that use it, like NCCL's LL/Simple protocols).
//
// Every message ends with a 32-bit epoch tag. A writer fills the body with plain stores, then
// stores the tag with release order; a reader that loads the current tag with acquire order owns
// the whole message (data-as-flag). Tags are derived from a per-buffer call sequence number:
// they change every call, never take the value 0 (fresh memory), and wrap around after 2^32-1
// calls; staging is double-buffered by sequence parity.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ubep::ep {

inline constexpr size_t kCacheLine = 64;
inline constexpr size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Tag of call `seq`: 1..2^32-1, consecutive calls differ, calls of the same parity differ.
inline uint32_t tag_of(uint64_t seq) { return static_cast<uint32_t>(seq % 0xFFFFFFFFull) + 1u; }
inline int half_of(uint64_t seq) { return static_cast<int>(seq & 1u); }

using Tag = std::atomic<uint32_t>;
static_assert(Tag::is_always_lock_free, "epoch tags must be lock-free to work across processes");

inline void publish(Tag* tag, uint32_t value) { tag->store(value, std::memory_order_release); }
inline bool arrived(const Tag* tag, uint32_t value) {
  return tag->load(std::memory_order_acquire) == value;
}

// Sizes of the three record kinds for a given buffer shape.
struct RecordFormat {
  size_t row_bytes = 0;   // hidden * dtype size
  int max_topk = 0;
  int local_experts = 0;

  // Token record: [row][src_token, topk][local_expert x K][expert_slot x K][weight x K][tag].
  size_t token_meta_offset() const { return round_up(row_bytes, 16); }
  size_t token_tag_offset() const {
    return round_up(token_meta_offset() + 8 + 12 * static_cast<size_t>(max_topk), 8);
  }
  size_t token_bytes() const { return round_up(token_tag_offset() + sizeof(Tag), kCacheLine); }

  // Count record: [rows][rows per local expert x E_local][tag].
  size_t count_tag_offset() const { return round_up(4 + 4 * static_cast<size_t>(local_experts), 8); }
  size_t count_bytes() const { return round_up(count_tag_offset() + sizeof(Tag), kCacheLine); }

  // Combine record: [row][tag].
  size_t combine_tag_offset() const { return round_up(row_bytes, 8); }
  size_t combine_bytes() const { return round_up(combine_tag_offset() + sizeof(Tag), kCacheLine); }
};

// Typed access to one token record.
struct TokenRecord {
  char* base;
  const RecordFormat* fmt;
  char* row() const { return base; }
  int32_t* src_token() const { return reinterpret_cast<int32_t*>(base + fmt->token_meta_offset()); }
  int32_t* topk() const { return src_token() + 1; }
  int32_t* local_expert() const { return src_token() + 2; }
  int32_t* expert_slot() const { return local_expert() + fmt->max_topk; }
  float* weight() const { return reinterpret_cast<float*>(expert_slot() + fmt->max_topk); }
  Tag* tag() const { return reinterpret_cast<Tag*>(base + fmt->token_tag_offset()); }
};

struct CountRecord {
  char* base;
  const RecordFormat* fmt;
  int32_t* rows() const { return reinterpret_cast<int32_t*>(base); }
  int32_t* expert_rows() const { return rows() + 1; }
  Tag* tag() const { return reinterpret_cast<Tag*>(base + fmt->count_tag_offset()); }
};

struct CombineRecord {
  char* base;
  const RecordFormat* fmt;
  char* row() const { return base; }
  Tag* tag() const { return reinterpret_cast<Tag*>(base + fmt->combine_tag_offset()); }
};

// Where everything lives inside one rank's shared window (the receiving side of each message).
struct StagingLayout {
  RecordFormat fmt;
  int ranks = 0;
  int64_t max_tokens = 0;
  int64_t combine_slots = 0;  // per half: max(ranks*max_tokens, max_tokens*max_topk)

  size_t count_off = 0, token_off = 0, combine_off = 0;
  size_t count_flag_off = 0, token_flag_off = 0, combine_flag_off = 0, stage_flag_off = 0;
  size_t total = 0;

  StagingLayout(const RecordFormat& f, int r, int64_t t, bool latency) : fmt(f), ranks(r), max_tokens(t) {
    const auto R = static_cast<size_t>(r);
    const auto T = static_cast<size_t>(t);
    combine_slots = static_cast<int64_t>(std::max(R * T, latency ? T * static_cast<size_t>(f.max_topk) : 0));
    size_t off = 0;
    count_off = off;
    off += 2 * R * f.count_bytes();
    token_off = off;
    off += 2 * R * T * f.token_bytes();
    combine_off = off;
    off += 2 * static_cast<size_t>(combine_slots) * f.combine_bytes();
    // Separate flags, used by the stop-and-wait sync mode and by bsp's set-flag stage.
    count_flag_off = off;
    off += round_up(2 * R * sizeof(Tag), kCacheLine);
    token_flag_off = off;
    off += round_up(2 * R * T * sizeof(Tag), kCacheLine);
    combine_flag_off = off;
    off += round_up(2 * static_cast<size_t>(combine_slots) * sizeof(Tag), kCacheLine);
    stage_flag_off = off;
    off += 2 * R * kCacheLine;
    total = off;
  }

  // Record `slot` from source `src` in half `half`, inside the window based at `base`.
  CountRecord count(void* base, int half, int src) const {
    return {static_cast<char*>(base) + count_off +
                (static_cast<size_t>(half) * static_cast<size_t>(ranks) + static_cast<size_t>(src)) *
                    fmt.count_bytes(),
            &fmt};
  }
  size_t token_index(int half, int src, int64_t slot) const {
    return (static_cast<size_t>(half) * static_cast<size_t>(ranks) + static_cast<size_t>(src)) *
               static_cast<size_t>(max_tokens) +
           static_cast<size_t>(slot);
  }
  TokenRecord token(void* base, int half, int src, int64_t slot) const {
    return {static_cast<char*>(base) + token_off + token_index(half, src, slot) * fmt.token_bytes(), &fmt};
  }
  size_t combine_index(int half, int64_t slot) const {
    return static_cast<size_t>(half) * static_cast<size_t>(combine_slots) + static_cast<size_t>(slot);
  }
  CombineRecord combine(void* base, int half, int64_t slot) const {
    return {static_cast<char*>(base) + combine_off + combine_index(half, slot) * fmt.combine_bytes(), &fmt};
  }
  Tag* count_flag(void* base, int half, int src) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + count_flag_off) +
           static_cast<size_t>(half) * static_cast<size_t>(ranks) + static_cast<size_t>(src);
  }
  Tag* token_flag(void* base, int half, int src, int64_t slot) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + token_flag_off) + token_index(half, src, slot);
  }
  Tag* combine_flag(void* base, int half, int64_t slot) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + combine_flag_off) + combine_index(half, slot);
  }
  // bsp's per-stage "done" flags: op 0 = dispatch, 1 = combine.
  Tag* stage_flag(void* base, int op, int src) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + stage_flag_off +
                                  (static_cast<size_t>(op) * static_cast<size_t>(ranks) + static_cast<size_t>(src)) * kCacheLine);
  }
};

}  // namespace ubep::ep
