// Every wire format of ubep in one place, kept apart from the algorithms that use it (like
// NCCL's LL/Simple protocols): epoch tags, count records, the map of one rank's window, the
// cross-host relay messages, the expert-layer combine records and the row codec.
//
// Backend-neutral: plain structs and inline functions that the CPU backend and nvcc-compiled
// device code both use (UBEP_HD). Tags are plain uint32_t words here; each backend supplies the
// release store / acquire load that publishes and tests them (src/backend/data_path.hpp).
//
// Data-as-flag: every message is completed by a 32-bit epoch tag stored after its body with
// release order; a reader that loads the current tag with acquire order owns the whole message.
// Count records carry the tag inside the record. Token rows are written straight into their
// final place in the receiver's output tensors, which must stay dense (a user-facing
// [rows, hidden] tensor has no room for a tag), so a row's tag lives in the row's metadata slot
// and is written after the row and its metadata: still one release store per message, no fence,
// no separate flag round.
//
// Tags are derived from a per-buffer call sequence number: they change every call, never take
// the value 0 (fresh memory) and wrap around after 2^32-1 calls. Everything is double-buffered by
// sequence parity ("halves"); see ubep.cpp for why that is enough.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/host_device.hpp"
#include "ubep/fp8.hpp"
#include "ubep/types.hpp"

namespace ubep::protocol {

inline constexpr size_t kCacheLine = 64;
UBEP_HD inline constexpr size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
UBEP_HD inline constexpr int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Tag of call `seq`: 1..2^32-1, consecutive calls differ, calls of the same parity differ.
UBEP_HD inline constexpr uint32_t tag_of(uint64_t seq) {
  return static_cast<uint32_t>(seq % 0xFFFFFFFFull) + 1u;
}
UBEP_HD inline constexpr int half_of(uint64_t seq) { return static_cast<int>(seq & 1u); }
// The first call sequence number of a buffer whose config says `initial_epoch`: the same tag as
// that epoch, but small, so the 64-bit counter never wraps (at the wrap tag_of(2^64-1) and
// tag_of(0) are both 1 and two consecutive calls would share a tag: finding F7).
UBEP_HD inline constexpr uint64_t first_seq_of(uint64_t initial_epoch) {
  return initial_epoch % 0xFFFFFFFFull;
}

// The call sequence of one buffer (the Window, the moe executor): the call's sequence number,
// its half (parity) and its tag, starting at first_seq_of(initial_epoch) -- the F7 guard, in
// one place for every host-side user.
class CallSequence {
 public:
  explicit CallSequence(uint64_t initial_epoch) : next_(first_seq_of(initial_epoch)) {}
  uint64_t begin_call() { return seq_ = next_++; }
  // After an agreement (docs/ELASTIC.md): the next call follows `seq`, the highest any live rank
  // used, so its tags differ from every earlier call's.
  void resume_after(uint64_t seq) { next_ = next_ > seq + 1 ? next_ : seq + 1; }
  // A repeated combine of the last call's dispatch: a sequence number (so a tag) of its own in
  // the same half, so none of its messages can be taken for the first combine's; the next call
  // still takes the other half.
  uint64_t begin_repeat() {
    seq_ += 2;
    next_ = seq_ + 1;
    return seq_;
  }
  uint64_t seq() const { return seq_; }
  int half() const { return half_of(seq_); }
  uint32_t tag() const { return tag_of(seq_); }

 private:
  uint64_t next_;
  uint64_t seq_ = 0;
};

// Failure words (WindowLayout::fail_word): 0, the call a rank rejected (fail_marker), the
// call in which its buffer broke for good (broken_marker: the marker with the top bit set), or
// kDeadWord: its process died, written by a survivor into its own window on the dead rank's
// behalf (docs/ELASTIC.md). Calls are counted modulo 2^31-1; peers are never more than a call
// or two apart.
inline constexpr uint32_t kBrokenBit = 0x80000000u;
inline constexpr uint32_t kDeadWord = kBrokenBit;  // the broken bit, marker 0 (never a call's)
inline constexpr uint64_t kMarkerPeriod = 0x7FFFFFFFull;
UBEP_HD inline constexpr uint32_t fail_marker(uint64_t call) {
  return static_cast<uint32_t>(call % kMarkerPeriod) + 1u;  // 1 .. 2^31-1: never 0
}
UBEP_HD inline constexpr uint32_t broken_marker(uint64_t call) {
  return kBrokenBit | fail_marker(call);
}
UBEP_HD inline constexpr bool is_broken(uint32_t word) { return (word & kBrokenBit) != 0; }
UBEP_HD inline constexpr bool is_dead(uint32_t word) { return word == kDeadWord; }
// The call a failure word names, taken as the one nearest to `near` (this rank's call).
UBEP_HD inline constexpr uint64_t marked_call(uint32_t word, uint64_t near) {
  const uint64_t m = (word & ~kBrokenBit) - 1u, here = near % kMarkerPeriod;
  const uint64_t ahead = (m + kMarkerPeriod - here) % kMarkerPeriod;  // 0 .. period-1
  return ahead < kMarkerPeriod / 2 ? near + ahead : near - (kMarkerPeriod - ahead);
}
// Whether a peer's failure word ends this rank's call `call` at once. A rejection ends only the
// call it names. A break in call M ends calls M and later only: a rank starts a call only after
// its earlier calls returned on it, so a peer that broke in M had sent its part of every call
// before M (it may be more than one call ahead: a combine needs only the ranks that hold its
// tokens' experts), and those can still complete here; this rank's next call then fails at its
// start. A Buffer destroyed after call M publishes a break in M+1 (its departure).
// A dead rank ends every call it is part of.
UBEP_HD inline constexpr bool failure_ends_call(uint32_t word, uint64_t call) {
  if (is_dead(word)) return true;
  return word != 0 &&
         (is_broken(word) ? marked_call(word, call) <= call : word == fail_marker(call));
}

// Call shape word of a count record: what a receiver must agree on with every sender.
UBEP_HD inline constexpr int32_t call_shape(int layout, int placement) {
  return layout | (placement << 8);
}

// An epoch tag word. Written only through a backend's release store, read only through its
// acquire load; aligned so both are single, lock-free accesses on every backend.
using Tag = uint32_t;

// Count record, one per (source, destination) per call:
//   [rows, topk, call shape (layout | placement << 8), rows per local expert][tag].
// The call shape lets a receiver name a peer that made a different call instead of misreading.
struct CountRecord {
  char* base;
  int local_experts;
  UBEP_HD int32_t* rows() const { return reinterpret_cast<int32_t*>(base); }
  UBEP_HD int32_t* topk() const { return rows() + 1; }
  UBEP_HD int32_t* shape() const { return rows() + 2; }
  UBEP_HD int32_t* expert_rows() const { return rows() + 3; }
  UBEP_HD Tag* tag() const { return reinterpret_cast<Tag*>(base + tag_offset(local_experts)); }
  UBEP_HD static constexpr size_t tag_offset(int el) {
    return round_up(12 + 4 * static_cast<size_t>(el), 8);
  }
  UBEP_HD static constexpr size_t bytes(int el) {
    return round_up(tag_offset(el) + sizeof(Tag), kCacheLine);
  }
};

// Membership record, one per (source, destination), outside the halves: the view of the group
// the source holds while it agrees with its peers on a change (a rank masked, a rank back),
// docs/ELASTIC.md. Every field is a 32-bit word written with a release store and read with an
// acquire load (a seqlock: stamp odd while the source rewrites it), so readers on any thread
// and process see a consistent record without a lock:
//   [stamp][round][calls lo][calls hi][seq lo][seq hi][flags][view word per rank:
//   incarnation << 1 | masked]; calls: the calls the source started, seq its last dispatch
//   sequence number, flags: kAbandoned (it gave up its last call: its part of it is missing),
//   kAgreeing (the record is part of an agreement, not only the news of a change).
struct MemberRecord {
  Tag* words;
  // kConfig: a digest of the rank's BufferConfig fields that shape the calls, so a replacement
  // whose config differs from the live ranks' is refused at its first agreement (issue 32).
  static constexpr int kStamp = 0, kRound = 1, kCalls = 2, kSeq = 4, kFlags = 6, kConfig = 7,
                       kView = 8;
  static constexpr uint32_t kAbandoned = 1;  // its last started call was given up
  static constexpr uint32_t kAgreeing = 2;   // published from inside an agreement
  UBEP_HD static constexpr size_t bytes(int ranks) {
    return round_up((kView + static_cast<size_t>(ranks)) * sizeof(Tag), kCacheLine);
  }
};

// ---- Row codec ---------------------------------------------------------------------------
// How one token row travels: its payload bytes, then optional per-row scale bytes (fp8: one
// fp32 scale per 128 channels). Every format below sizes dispatch rows through the codec, so a
// new dtype is a codec and a DType value, not an edit of every format. On the wire (relay
// messages, the baseline's records) a row is payload then scales, contiguous; in a window and
// in the user's tensors the two live in separate dense arrays (recv_x, recv_x_scales), so a
// row in transit is a RowRef to both parts.
struct RowCodec {
  size_t payload_bytes = 0;  // hidden x element size
  size_t scale_bytes = 0;    // per-row scales travelling with the payload (0: none)
  UBEP_HD constexpr size_t row_bytes() const { return payload_bytes + scale_bytes; }
};
// The codec of a dispatch dtype (host side; device code receives the sizes).
inline RowCodec row_codec(DType dtype, int64_t hidden) {
  const auto h = static_cast<size_t>(hidden);
  if (dtype == DType::kFP8E4M3)
    return {h, static_cast<size_t>(fp8_scales_per_row(hidden)) * sizeof(float)};
  return {h * dtype_size(dtype), 0};
}
struct RowRef {
  const char* payload;
  const char* scales;  // nullptr when the codec has no scales
};
// Rows stored as two dense arrays, [rows, payload] and [rows, scales] (a user's x and x_scales,
// or a cast-on-send staging copy).
struct RowArrays {
  const char* payload = nullptr;
  const char* scales = nullptr;
  RowCodec codec;
  UBEP_HD RowRef row(int64_t i) const {
    const auto u = static_cast<size_t>(i);
    return {payload + u * codec.payload_bytes,
            codec.scale_bytes ? scales + u * codec.scale_bytes : nullptr};
  }
};
// A contiguous wire row (payload then scales) as a RowRef.
UBEP_HD inline RowRef wire_row(const char* row, const RowCodec& c) {
  return {row, c.scale_bytes ? row + c.payload_bytes : nullptr};
}

// A latency row's metadata, in the owner's window next to the row's tag: the sender writes the
// token and k word, then publishes the tag (release), so one line holds both, for up to 8 rows.
// Three arrays (source pairs, k bytes, tags) made three lines a sender's stores missed per group
// of rows to one expert; one record made a tiny dispatch 10% (bf16) and 18% (fp8) faster
// (docs/PERFORMANCE.md, issue 31). The source is not sent: the owner reads it off the (expert,
// source) range the row lies in.
struct LatencyRecord {
  Tag tag;
  uint32_t token_k;  // token << 8 | k (k < 256: max_topk is at most 64; token < kMaxTokens)
  static constexpr int64_t kMaxTokens = int64_t{1} << 24;
  UBEP_HD static constexpr uint32_t pack(int64_t token, int k) {
    return static_cast<uint32_t>(token) << 8 | static_cast<uint32_t>(k);
  }
  UBEP_HD int64_t token() const { return static_cast<int64_t>(token_k >> 8); }
  UBEP_HD int k() const { return static_cast<int>(token_k & 0xffu); }
};
static_assert(sizeof(LatencyRecord) == 8);

// One rank's shared window. Each half holds, for the dispatch of that parity:
//   counts  [R] count records (from every source)
//   tp_*    throughput outputs, written by the senders at their final row:
//           x [R*T, payload], scale [R*T, scales], src [R*T, 2] i64, idx [R*T, K] i32,
//           w [R*T, K] f32, tag [R*T]
//   lat_*   latency outputs: x [El, R*T, payload], scale [El, R*T, scales], rec [El, R*T]
//           (LatencyRecord: tag, token and k, written by the senders), src [El, R*T, 2] i64
//           (source rank and token, written by the owner itself from the records as their tags
//           arrive: the sender's source is the range the row lies in)
//   comb_*  the combine input of this rank (ubep's owners read it in place): rows shaped like
//           the dispatch output, a tag per row
//   push    bsp's combine staging on the owner: [max(R*T, T*K)] rows
// Dispatch rows (x, scale) are sized by the dispatch codec, combine rows (comb, push) by
// row_bytes, the combine dtype's row: they differ for fp8 (combine is bf16).
// plus separate flags: count-record flags for the stop-and-wait sync mode and bsp's stage flags.
struct WindowLayout {
  size_t row_bytes = 0;  // a combine row (and a dispatch row when the codec has no scales)
  RowCodec codec;        // dispatch rows
  int ranks = 0, local_experts = 0, max_topk = 0;
  int64_t max_tokens = 0;
  bool latency = false;

  UBEP_HD int64_t tp_rows() const { return static_cast<int64_t>(ranks) * max_tokens; }
  UBEP_HD int64_t lat_rows() const {
    return latency ? static_cast<int64_t>(local_experts) * tp_rows() : 0;
  }
  UBEP_HD int64_t comb_rows() const { return max64(tp_rows(), lat_rows()); }
  UBEP_HD int64_t push_rows() const { return max64(tp_rows(), max_tokens * max_topk); }

  size_t counts = 0, tp_x = 0, tp_scale = 0, tp_src = 0, tp_idx = 0, tp_w = 0, tp_tag = 0;
  size_t lat_x = 0, lat_scale = 0, lat_rec = 0, lat_src = 0, comb_x = 0, comb_tag = 0, push = 0;
  size_t half_bytes = 0, count_flags = 0, stage_flags = 0, fail_words = 0, members = 0, total = 0;
  // bsp's flag slots: 0 = dispatch verify, 1 = combine verify, 2.. = its stage barriers.
  static constexpr int kStageSlots = 8;

  WindowLayout() = default;
  // Dispatch and combine rows of the same size, no scales (bf16/fp32).
  WindowLayout(size_t rb, int r, int el, int k, int64_t t, bool lat)
      : WindowLayout(RowCodec{rb, 0}, rb, r, el, k, t, lat) {}
  WindowLayout(RowCodec dispatch, size_t combine_rb, int r, int el, int k, int64_t t, bool lat)
      : row_bytes(combine_rb),
        codec(dispatch),
        ranks(r),
        local_experts(el),
        max_topk(k),
        max_tokens(t),
        latency(lat) {
    const size_t rb = combine_rb, xb = dispatch.payload_bytes, sb = dispatch.scale_bytes;
    size_t off = 0;
    auto take = [&](size_t bytes) {
      const size_t at = off;
      off = round_up(off + bytes, kCacheLine);
      return at;
    };
    const auto R = static_cast<size_t>(r), TP = static_cast<size_t>(tp_rows()),
               LAT = static_cast<size_t>(lat_rows());
    // The latency rows first, at the start of each half: a decode dispatch writing its rows
    // there was faster than with them after the counts and throughput regions (3.5 MiB in, 2176
    // bytes into a page) in 3 of 4 alternated pairs for bf16 and for fp8 (median pair ratio
    // 0.92, 0.91; why, without counters, not known: docs/PERFORMANCE.md, issue 31, 31st session).
    lat_x = take(LAT * xb);
    counts = take(R * CountRecord::bytes(el));
    tp_x = take(TP * xb);
    tp_scale = take(TP * sb);
    tp_src = take(TP * 16);
    tp_idx = take(TP * static_cast<size_t>(k) * 4);
    tp_w = take(TP * static_cast<size_t>(k) * 4);
    tp_tag = take(TP * sizeof(Tag));
    lat_scale = take(LAT * sb);
    lat_rec = take(LAT * sizeof(LatencyRecord));
    lat_src = take(LAT * 16);
    comb_x = take(static_cast<size_t>(comb_rows()) * rb);
    comb_tag = take(static_cast<size_t>(comb_rows()) * sizeof(Tag));
    push = take(static_cast<size_t>(push_rows()) * rb);
    half_bytes = round_up(off, 4096);
    off = 2 * half_bytes;
    count_flags = take(2 * R * sizeof(Tag));
    stage_flags = take(kStageSlots * R * kCacheLine);
    fail_words = take(R * sizeof(Tag));
    members = take(R * MemberRecord::bytes(r));
    total = off;
  }

  UBEP_HD char* half(void* base, int h) const {
    return static_cast<char*>(base) + static_cast<size_t>(h) * half_bytes;
  }
  template <typename T>
  UBEP_HD T* at(void* base, int h, size_t region) const {
    return reinterpret_cast<T*>(half(base, h) + region);
  }
  UBEP_HD CountRecord count(void* base, int h, int src) const {
    return {half(base, h) + counts + static_cast<size_t>(src) * CountRecord::bytes(local_experts),
            local_experts};
  }
  UBEP_HD Tag* count_flag(void* base, int h, int src) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + count_flags) +
           static_cast<size_t>(h) * static_cast<size_t>(ranks) + static_cast<size_t>(src);
  }
  // Failure word of source `src` in this window: 0, fail_marker(call) when src failed that call
  // before sending anything (bad input), or broken_marker(call) once src's buffer broke in that
  // call. Never reset:
  // a new Buffer has new windows.
  UBEP_HD Tag* fail_word(void* base, int src) const {
    return reinterpret_cast<Tag*>(static_cast<char*>(base) + fail_words) + src;
  }
  // The membership record `src` last published into this window (membership.hpp).
  UBEP_HD MemberRecord member_record(void* base, int src) const {
    return {reinterpret_cast<Tag*>(static_cast<char*>(base) + members +
                                   static_cast<size_t>(src) * MemberRecord::bytes(ranks))};
  }
  // bsp's per-stage flags (kStageSlots slots, see above).
  UBEP_HD Tag* stage_flag(void* base, int op, int src) const {
    return reinterpret_cast<Tag*>(
        static_cast<char*>(base) + stage_flags +
        (static_cast<size_t>(op) * static_cast<size_t>(ranks) + static_cast<size_t>(src)) *
            kCacheLine);
  }
};

// ---- Cross-host relay messages (src/ep/relay.cpp) -----------------------------------------
// One message per (source, destination host) per dispatch: a header, then one packed token per
// token with an expert on that host. Combine sends back one fp32 partial [tokens, hidden].
namespace relay_wire {
// Transport tags of the two message kinds: kDispatchTag + 2 * (dispatch seq mod kTagSeqs), + 1
// for its combine: above the death notices' 7103 and the mesh's 7105-7106, below the membership
// records' (24576 up, one tag per Buffer) and MPI's least tag bound 32767. The arithmetic lives
// here only: HostRelay sends and receives with these, and drops unmatched messages of other
// calls with is_relay_tag.
inline constexpr int kDispatchTag = 8192;
inline constexpr int kTagSeqs = 8192;
inline constexpr int dispatch_tag(uint64_t seq) {
  return kDispatchTag + 2 * static_cast<int>(seq % kTagSeqs);
}
inline constexpr int combine_tag(uint64_t seq) { return dispatch_tag(seq) + 1; }
// Whether transport tag t belongs to a relay message (of any call).
inline constexpr bool is_relay_tag(int t) {
  return t >= kDispatchTag && t < kDispatchTag + 2 * kTagSeqs;
}
static_assert(kDispatchTag + 2 * kTagSeqs - 1 <= 32767, "relay tags within MPI's least tag bound");
inline constexpr size_t kHeader = 16;  // a Header, padded

// A dispatch message's header: its tokens, the sender's topk and the sender's call shape
// (DispatchCall::shape: the receivers compare it with their own and name a mismatched call).
// A combine message carries only the first two.
struct Header {
  int32_t tokens = 0, topk = 0, shape = 0;
};
static_assert(sizeof(Header) <= kHeader);
inline void write_header(char* msg, const Header& h) { std::memcpy(msg, &h, sizeof h); }
inline Header read_header(const char* msg) {
  Header h;
  std::memcpy(&h, msg, sizeof h);
  return h;
}

// One packed token: [row, padded to 8][int32 token][int32 expert x K][float weight x K].
UBEP_HD inline constexpr size_t meta_offset(size_t row_bytes) { return round_up(row_bytes, 8); }
UBEP_HD inline constexpr size_t record_bytes(size_t row_bytes, int max_topk) {
  return round_up(meta_offset(row_bytes) + 4 + 8 * static_cast<size_t>(max_topk), 16);
}
struct PackedToken {
  char* base;
  size_t row_bytes;
  int K;
  UBEP_HD char* row() const { return base; }
  UBEP_HD char* meta() const { return base + meta_offset(row_bytes); }
  UBEP_HD int32_t* token() const { return reinterpret_cast<int32_t*>(meta()); }
  UBEP_HD int32_t* idx() const { return reinterpret_cast<int32_t*>(meta() + 4); }
  UBEP_HD float* w() const {
    return reinterpret_cast<float*>(meta() + 4 + 4 * static_cast<size_t>(K));
  }
  // Packs one token: its row as the codec lays it out, then its index, experts and weights.
  void write(const RowCodec& codec, const RowRef& src, int32_t token_index, const int32_t* experts,
             const float* weights) const {
    std::memcpy(row(), src.payload, codec.payload_bytes);
    if (codec.scale_bytes) std::memcpy(row() + codec.payload_bytes, src.scales, codec.scale_bytes);
    std::memcpy(meta(), &token_index, 4);
    std::memcpy(meta() + 4, experts, 4 * static_cast<size_t>(K));
    std::memcpy(meta() + 4 + 4 * static_cast<size_t>(K), weights, 4 * static_cast<size_t>(K));
  }
};
}  // namespace relay_wire

// ---- Expert-layer combine records (src/moe/expert_layer.cpp) ------------------------------
// One record per (token, k) slot in the owner's window: [row][epoch tag], the tag written last
// (release) and read first (acquire). Word 0 of that window is the owner's `released` counter.
struct TileRecordFormat {
  size_t row_bytes = 0;
  UBEP_HD constexpr size_t tag_offset() const { return round_up(row_bytes, 8); }
  UBEP_HD constexpr size_t bytes() const {
    return round_up(tag_offset() + sizeof(Tag), kCacheLine);
  }
};
struct TileRecord {
  char* base;
  const TileRecordFormat* fmt;
  UBEP_HD char* row() const { return base; }
  UBEP_HD Tag* tag() const { return reinterpret_cast<Tag*>(base + fmt->tag_offset()); }
};

}  // namespace ubep::protocol
