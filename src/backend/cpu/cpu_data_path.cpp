#include "backend/cpu/cpu_data_path.hpp"

#include <atomic>
#include <cstring>

#include "backend/cpu/row_kernels.hpp"
#include "backend/cpu/tags.hpp"
#include "core/worker_team.hpp"

namespace ubep::cpu {

namespace {

// One fence per batch of streamed rows, not per row.
//
// Why it is correct. Non-temporal stores are weakly ordered: a row written with them may
// become visible after a later ordinary store, so an sfence must separate a row from the
// release store of its tag. One sfence orders *every* earlier non-temporal store of this thread
// before every later store, so a member that streams rows r1..rK, fences once, and only then
// stores their K tags still shows each tag only after its row (writer: the member thread;
// reader: whoever acquire-loads the tag -- it then sees the row, as before). Only the tags wait;
// rows are never reordered with anything a reader acts on.
//
// Why nobody waits forever for a held-back tag. A tag is held back only inside run_roles (a
// role function), at most kMaxHeld tags or kMaxHeldBytes of rows, and is released, in order,
// before this thread next tests a tag (arrived/load: every bounded wait of the algorithms
// goes through them), fences, publishes in stop-and-wait mode, or returns from its role
// function (also by an exception: the rows before the tags were completely written). So a
// member holds tags only while it is writing more rows; the one wait that does not go through
// arrived -- ubep's token senders waiting for their own rank's offset role -- depends only on
// count records of other ranks, which never wait for this call's rows (src/ep/ubep.cpp).
// Outside roles every publish fences and stores at once.
//
// Streamed stores that no held tag waits for (a combine's streamed output) stay unfenced across
// tag tests: nobody waits on them, and the next publish or the role's end fences them before
// anything announces them. Fencing them at every tag test cost a prefill combine one sfence per
// token, each waiting for that token's output row to drain to memory (docs/PERFORMANCE.md).
//
// The state is per thread (an sfence orders only its own thread's stores); members of a team
// are distinct threads, and a thread rank's caller thread is its own member 0.
constexpr int kMaxHeld = 16;
constexpr size_t kMaxHeldBytes = size_t{256} << 10;

struct HeldTags {
  bool unfenced = false;  // streamed stores since the last fence
  int in_role = 0;        // depth of run_roles on this thread
  int n = 0;
  size_t bytes = 0;  // streamed row bytes since the last release
  protocol::Tag* tag[kMaxHeld] = {};
  uint32_t value[kMaxHeld] = {};

  void release() {
    if (unfenced) kernels::store_fence();
    unfenced = false;
    for (int i = 0; i < n; ++i) publish_tag(tag[i], value[i]);
    n = 0;
    bytes = 0;
  }
};
// In a shared object (the Python extension) every access of a thread_local is a call of
// __tls_get_addr, and one that needs dynamic initialization also tests a guard first: publish()
// made up to four such calls a row, and one more per tag it released. So the state is
// constant-initialized and reached through held_here() once per function: the empty asm hides
// where its pointer comes from, so the compiler keeps the pointer in a register rather than
// computing the address again at each use (which it otherwise does, cheap as that is in an
// executable).
constinit thread_local HeldTags held;
HeldTags& held_here() {
  HeldTags* h = &held;
  asm("" : "+r"(h));
  return *h;
}

// Marks this thread as running a role function for its lifetime; releases on the way out.
struct RoleScope {
  RoleScope() { ++held_here().in_role; }
  ~RoleScope() {
    HeldTags& h = held_here();
    h.release();
    --h.in_role;
  }
  RoleScope(const RoleScope&) = delete;
  RoleScope& operator=(const RoleScope&) = delete;
};

}  // namespace

CpuDataPath::CpuDataPath(int workers) : team_(std::make_unique<WorkerTeam>(workers)) {}
CpuDataPath::~CpuDataPath() = default;

int CpuDataPath::members() const { return team_->size(); }

void CpuDataPath::run_erased(void* obj, void (*fn)(void*, int)) {
  team_->run([&](int m) {
    RoleScope scope;
    fn(obj, m);
  });
}

void CpuDataPath::put_row(void* dst, const void* src, size_t bytes, bool stream) const {
  if (!stream) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Also marked when the copy fell back to memcpy (unaligned rows, sanitizer builds), so the
  // batching logic runs -- and is checked by TSan -- the same way everywhere.
  kernels::stream_row_to_peer(dst, src, bytes);
  HeldTags& h = held_here();
  h.unfenced = true;
  h.bytes += bytes;
}

void CpuDataPath::put(void* dst, const void* src, size_t bytes) const {
  std::memcpy(dst, src, bytes);
}

namespace {
// A message's metadata pieces are a few bytes each: copies of a size known here are a load and
// a store, where memcpy of a run-time size is a library call.
void copy_piece(void* dst, const void* src, size_t bytes) {
  if (bytes == 32) return static_cast<void>(std::memcpy(dst, src, 32));  // topk 8's ids, weights
  if (bytes == 16) return static_cast<void>(std::memcpy(dst, src, 16));  // a row's source
  if (bytes == 4) return static_cast<void>(std::memcpy(dst, src, 4));    // a latency row's k
  std::memcpy(dst, src, bytes);
}
}  // namespace

void CpuDataPath::put_message(const backend::RowMessage& m) const {
  for (int i = 0; i < m.num_soon; ++i) __builtin_prefetch(m.soon[i], 1);
  // The scales' lines that take plain stores are fetched while the payload streams, so their
  // stores do not wait for them: fp8 decode dispatch 463-481 -> 420-431 us on 2 process ranks
  // (docs/PERFORMANCE.md, fp8). Streamed, only the partial line at each end takes them.
  if (const size_t sb = m.scale_bytes; sb && !m.stream) {
    kernels::prefetch_for_write(m.scale_dst, sb);
  } else if (sb) {
    __builtin_prefetch(m.scale_dst, 1);
    __builtin_prefetch(m.scale_dst + sb - 1, 1);
  }
  if (m.stream) {
    kernels::stream_row_to_peer(m.payload_dst, m.payload, m.payload_bytes);
    if (m.scale_bytes) kernels::stream_row_to_peer(m.scale_dst, m.scales, m.scale_bytes);
    HeldTags& h = held_here();  // as put_row: marked even where a copy fell back to memcpy
    h.unfenced = true;
    h.bytes += m.payload_bytes + m.scale_bytes;
  } else {
    std::memcpy(m.payload_dst, m.payload, m.payload_bytes);
    if (m.scale_bytes) std::memcpy(m.scale_dst, m.scales, m.scale_bytes);
  }
  for (int i = 0; i < m.num_pieces; ++i)
    copy_piece(m.pieces[i].dst, m.pieces[i].src, m.pieces[i].bytes);
}

void CpuDataPath::publish(protocol::Tag* tag, uint32_t value, bool stop_and_wait) const {
  HeldTags& h = held_here();
  if (stop_and_wait) {
    h.release();
    std::atomic_thread_fence(std::memory_order_seq_cst);
  } else if (h.unfenced && h.in_role > 0) {
    h.tag[h.n] = tag;
    h.value[h.n] = value;
    if (++h.n == kMaxHeld || h.bytes >= kMaxHeldBytes) h.release();
    return;
  } else {
    h.release();  // fences if a row is unfenced (no tag is held outside roles)
  }
  publish_tag(tag, value);
}

bool CpuDataPath::arrived(const protocol::Tag* tag, uint32_t value) const {
  if (HeldTags& h = held_here(); h.n > 0) h.release();
  return tag_arrived(tag, value);
}

uint32_t CpuDataPath::load(const protocol::Tag* tag) const {
  if (HeldTags& h = held_here(); h.n > 0) h.release();
  return load_tag(tag);
}

void CpuDataPath::fence() const {
  held_here().release();
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void CpuDataPath::reduce_rows(void* out, DType dtype, int64_t hidden, const void* const* rows,
                              const float* weights, int n, bool stream,
                              const void* const* next_rows, int next_n, bool sequential) const {
  kernels::reduce_rows(out, dtype, hidden, rows, weights, n, stream, next_rows, next_n,
                       /*prefetch=*/!sequential);
  if (!stream) return;
  HeldTags& h = held_here();
  h.unfenced = true;  // fenced when the role ends (run_roles' return publishes the output)
  if (h.in_role == 0) h.release();
}

void CpuDataPath::accumulate_row(float* acc, const void* row, DType dtype, int64_t hidden,
                                 const float* weight) const {
  if (weight)
    kernels::accumulate_row_weighted(acc, row, dtype, hidden, *weight);
  else
    kernels::accumulate_row(acc, row, dtype, hidden);
}

void CpuDataPath::store_row(void* dst, const float* acc, DType dtype, int64_t hidden) const {
  kernels::store_row(dst, acc, dtype, hidden);
}

}  // namespace ubep::cpu
