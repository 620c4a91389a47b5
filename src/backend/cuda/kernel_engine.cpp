#include "backend/cuda/kernel_engine.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/host_logic.hpp"
#include "backend/cuda/local_windows.hpp"
#include "protocol/call_checks.hpp"
#include "ubep/error.hpp"

namespace ubep::cuda_host {

using protocol::Phase;

namespace {
// What a rank tells its peers at set-up: enough to reach its window from any process.
struct PeerInfo {
  int64_t pid = 0;
  uint64_t window = 0;  // address in the owner's process
  int32_t device = 0;
  uint32_t handle_bytes = 0;
  char handle[120] = {};  // DeviceOps::export_memory (a cudaIpcMemHandle_t is 64 bytes)
};
}  // namespace

KernelEngine::KernelEngine(Group& group, const BufferConfig& cfg, std::unique_ptr<DeviceOps> ops)
    : group_(group),
      cfg_(cfg),
      ops_(std::move(ops)),
      seq_(cfg, group.size(), group.rank(), 1),
      rank_(group.rank()),
      ranks_(group.size()),
      machine_(
          group.rank(), group.size(), [this](int r) { return failure_of(r); },
          [this](uint32_t word) { publish_failure(word); }) {
  UBEP_CHECK_ARG(group.single_host(), "Buffer on ", cfg.device.describe(), ": the group spans ",
                 group.num_hosts(),
                 " hosts; the CUDA backend maps peers within one host (CUDA IPC) only");
  timeout_s_ = std::chrono::duration<double>(group.options().timeout).count();
  threads_ = ops_->threads_per_block();
  smem_ = dispatch_smem(threads_ / 32, cfg.max_topk, cfg.num_experts / ranks_);
  const protocol::WindowLayout& map = seq_.map();
  const cuda_hd::ScratchLayout& smap = seq_.scratch_map();
  const size_t y_bytes = static_cast<size_t>(cfg.max_tokens_per_rank) * map.row_bytes;
  // Windows start zeroed (a tag is never 0) and are never cleaned again.
  if (ops_->host_readable()) {
    shared_ = group.allocate_window(map.total);
    window_ = static_cast<char*>(shared_->local());
  } else {
    window_ = static_cast<char*>(ops_->alloc_device(map.total));
    // Released with the window, by whichever rank of this process lets go of it last. The owner
    // fills `allocs` in its destructor before it drops its reference; the release runs after
    // the last reference is dropped (shared_ptr's count is acquire-release), so it sees them.
    own_window_ = share_local_window(window_, [ops = ops_, allocs = allocs_](char* p) {
      ops->free_device(p);
      for (void* d : allocs->device) ops->free_device(d);
      for (void* m : allocs->mapped) ops->free_mapped(m);
    });
  }
  scratch_ = static_cast<char*>(ops_->alloc_device(smap.total));
  y_ = static_cast<char*>(ops_->alloc_device(std::max<size_t>(y_bytes, 16)));
  bases_dev_ = static_cast<char**>(ops_->alloc_device(static_cast<size_t>(ranks_) * sizeof(char*)));
  claim_ = static_cast<uint32_t*>(ops_->alloc_device(sizeof(uint32_t)));
  void* error_dev = nullptr;
  void* rows_dev = nullptr;
  error_ =
      static_cast<cuda_hd::ErrorInfo*>(ops_->alloc_mapped(sizeof(cuda_hd::ErrorInfo), &error_dev));
  recv_rows_ = static_cast<int64_t*>(ops_->alloc_mapped(sizeof(int64_t), &rows_dev));
  *recv_rows_ = -1;
  seq_.set_rank_memory(0, scratch_, y_);
  res_.bases = bases_dev_;
  res_.timeout_cycles = ops_->timeout_cycles(timeout_s_);
  res_.error = {static_cast<cuda_hd::ErrorInfo*>(error_dev), claim_};
  res_.host_recv_rows = static_cast<int64_t*>(rows_dev);
  map_peers();
}

// Set-up (collective): every rank publishes its window's address and an IPC handle; a peer in
// this process is reached through its pointer, one in another process through its handle. Ranks
// of this process on the same device split its co-resident blocks. The closing barrier: nobody
// writes into a window before its owner has zeroed it (alloc_device is synchronous).
void KernelEngine::map_peers() {
  if (shared_) {  // every peer's window is mapped by the group already
    bpr_ = ops_->blocks_per_rank(1, smem_);
    res_.blocks_per_rank = bpr_;
    bases_.resize(static_cast<size_t>(ranks_));
    for (int r = 0; r < ranks_; ++r)
      bases_[static_cast<size_t>(r)] = static_cast<char*>(shared_->base(r));
    seq_.set_bases(bases_);
    ops_->copy(bases_dev_, bases_.data(), bases_.size() * sizeof(char*));
    return;
  }
  PeerInfo mine;
  mine.pid = static_cast<int64_t>(::getpid());
  mine.window = reinterpret_cast<uint64_t>(window_);
  mine.device = ops_->device().index;
  const std::vector<char> h = ops_->export_memory(window_);
  UBEP_CHECK(h.size() <= sizeof mine.handle, SystemError, "window handle of ", h.size(),
             " bytes does not fit");
  mine.handle_bytes = static_cast<uint32_t>(h.size());
  std::memcpy(mine.handle, h.data(), h.size());
  std::vector<PeerInfo> all(static_cast<size_t>(ranks_));
  group_.allgather(&mine, all.data(), sizeof mine);
  int ranks_here = 0;
  for (const PeerInfo& p : all) ranks_here += p.pid == mine.pid && p.device == mine.device;
  bpr_ = ops_->blocks_per_rank(ranks_here, smem_);
  res_.blocks_per_rank = bpr_;
  bases_.resize(static_cast<size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    const PeerInfo& p = all[static_cast<size_t>(r)];
    if (r == rank_) {
      bases_[static_cast<size_t>(r)] = window_;
    } else if (p.pid == mine.pid) {
      if (p.device != mine.device) ops_->enable_peer(p.device);
      char* base = reinterpret_cast<char*>(p.window);
      // The owner published it before the allgather and waits at the barrier below.
      std::shared_ptr<char> ref = find_local_window(base);
      UBEP_CHECK(ref, SystemError, "rank ", r, "'s window (this process, device ", p.device,
                 ") is not published; every rank of a group must use the same ubep library");
      local_peers_.push_back(std::move(ref));
      bases_[static_cast<size_t>(r)] = base;
    } else {
      remote_peers_ = true;
      void* opened = ops_->open_memory(std::vector<char>(p.handle, p.handle + p.handle_bytes));
      opened_.push_back(opened);
      bases_[static_cast<size_t>(r)] = static_cast<char*>(opened);
    }
  }
  seq_.set_bases(bases_);
  ops_->copy(bases_dev_, bases_.data(), bases_.size() * sizeof(char*));
  group_.barrier();
}

// Departure: as the host backend (ep::HostEngine), peers waiting in a call this rank will never
// make learn it from its failure word. Peers of this process: their windows and this one are
// freed when the last of them lets go (local_windows.hpp), so no collective -- a Buffer may go
// on any thread (Python's garbage collector frees thread ranks' Buffers one after another on
// one thread). Peers in other processes: a barrier, so none still reads this window (a combine
// reads rows in place) when it is freed -- bounded by the group's timeout when a peer is gone.
// Windows from the group live as long as the group: no barrier.
KernelEngine::~KernelEngine() {
  try {
    ops_->synchronize();  // this rank's kernels are done with every window it references
    machine_.depart();
    if (remote_peers_) group_.barrier();
  } catch (...) {  // a dead peer: nothing more to agree on
  }
  for (void* p : opened_) ops_->close_memory(p);
  if (own_window_) {
    // cudaFree waits for the whole device: freed now, it would stall a peer thread's kernel
    // until a call this thread never makes times out. So the last rank of this process to let
    // go frees every rank's memory, once no rank here has a kernel left.
    allocs_->device = {scratch_, y_, compact_, bases_dev_, claim_};
    allocs_->mapped = {error_, recv_rows_};
    local_peers_.clear();
    own_window_.reset();
    return;
  }
  ops_->free_device(scratch_);
  ops_->free_device(y_);
  ops_->free_device(compact_);
  ops_->free_device(bases_dev_);
  ops_->free_device(claim_);
  ops_->free_mapped(error_);
  ops_->free_mapped(recv_rows_);
}

// ---- failure words (the protocol of src/protocol/protocol.hpp, as ep::HostEngine uses it) ----

void KernelEngine::publish_failure(uint32_t word) {
  for (int r = 0; r < ranks_; ++r)
    if (r != rank_)
      ops_->store_word(seq_.map().fail_word(bases_[static_cast<size_t>(r)], rank_), word);
}

uint32_t KernelEngine::failure_of(int peer) const {
  return ops_->load_word(seq_.map().fail_word(window_, peer));
}

void KernelEngine::break_call(const char* what, const std::exception& cause) {
  machine_.fail(what, cause);
  throw;
}

void KernelEngine::check_idle(const char* what) const {
  machine_.require_usable(what);
  machine_.require_idle(what);
}

void KernelEngine::finish(const char* what) {
  try {
    ops_->synchronize();
  } catch (const std::exception& e) {
    break_call(what, e);
  }
  // The device wrote the details, a system fence, then the code: a non-zero code read here
  // means the details are complete (the launch has finished: synchronize()).
  const uint32_t code = *reinterpret_cast<const volatile uint32_t*>(&error_->code);
  if (code == cuda_hd::kOk) return;
  cuda_hd::ErrorInfo e;
  std::memcpy(&e, error_, sizeof e);
  e.code = code;
  if (code == cuda_hd::kBadExpert) {
    // Bad expert ids were routed nowhere on every rank: the call completed and the ranks are in
    // step, so the error is this call's alone. Clear the word and the claim for the next call.
    std::memset(static_cast<void*>(error_), 0, sizeof *error_);
    const uint32_t zero = 0;
    ops_->copy(claim_, &zero, sizeof zero);
    throw_if_error(e, timeout_s_);
  }
  try {
    if (code == cuda_hd::kPeerFailed) {
      // Named as the host backend names it (ep::FailureWatch): the peer, the call it failed.
      const uint32_t word = e.tag;
      if (protocol::is_broken(word))
        throw PeerFailedError(detail::concat(
            "rank ", e.peer, " failed call ", protocol::marked_call(word, calls()),
            " (its buffer is broken), so call ", calls(), " cannot complete on rank ", rank_));
      throw PeerFailedError(detail::concat("rank ", e.peer, " rejected its input for call ",
                                           calls(), ", so the call cannot complete on rank ",
                                           rank_));
    }
    if (code == cuda_hd::kTimeout)
      throw TimeoutError(detail::concat(describe(e, timeout_s_), " in call ", calls()));
    throw_if_error(e, timeout_s_);
  } catch (const std::exception& ex) {
    break_call(what, ex);
  }
}

// Every wait of the launch polls the failure words in this rank's window for this call.
void KernelEngine::arm(cuda_hd::LaunchParams& p) const {
  p.call = calls();
  p.error.call = calls();
  p.error.fail_words = seq_.map().fail_word(window_, 0);
}

// ---- calls ------------------------------------------------------------------------------------

// Starts a call: the inputs are checked (Sequencer) before anything is launched, so a rejection
// leaves the buffer usable and tells the peers through this rank's failure word.
void KernelEngine::launch_dispatch(const DispatchArgs* args, uint32_t phases, const char* what) {
  cuda_hd::LaunchParams p;
  if (args) {
    machine_.start(what);
    machine_.accept(what, [&] {
      // Shapes, dtypes, devices, pointers, and the ids where the host can read them.
      p = seq_.dispatch({args, 1}, phases, res_, ops_->host_readable());
    });
    layout_ = args->layout;
    tokens_ = args->x.dim(0);
    topk_ = static_cast<int>(args->topk_idx.dim(1));
    machine_.dispatched();
    num_recv_rows_ = -1;
  } else {
    p = seq_.dispatch({}, phases, res_);
  }
  arm(p);
  stats_ = {};
  if (seq_.algorithm == Algorithm::kBsp && (phases & cuda_hd::kSend)) stats_.barriers = 2;
  try {
    ops_->launch_dispatch(p, bpr_, threads_, smem_);
  } catch (const std::exception& e) {
    break_call(what, e);
  }
}

// A combine's arguments as the kernels take them (the engine's own checks first): throws
// InvalidArgument before anything is launched.
cuda_hd::LaunchParams KernelEngine::combine_params(const CombineArgs& args, uint32_t phases,
                                                   const char* what) {
  machine_.require_dispatch(what);
  // A repeat needs a new tag in the same half and a barrier before it, so that no peer still
  // reads the rows it rewrites (src/ep/repeat_combine.cpp); the kernels' combine has neither
  // (ubep's makes no barrier at all), so it stays the host engine's.
  UBEP_CHECK_ARG(!machine_.combined(), what, ": dispatch ", seq_.results()[0].handle,
                 " was already combined; on ", cfg_.device.describe(),
                 " each dispatch is combined at most once (peers may still be reading the "
                 "rows of the first combine; repeated combine is on the cpu device only)");
  UBEP_CHECK_ARG(args.out.ndim == 0, what, ": out is the cpu device's (on ", cfg_.device.describe(),
                 " y is Buffer memory: copy it)");
  CombineArgs a = args;
  // Compact throughput rows: the result's recv_x has num_recv_rows rows (as on the host
  // backend); the kernels address the window by capacity.
  const DispatchResult cap = seq_.results()[0];
  if (!a.compacted && layout_ == Layout::kThroughput && cap.placement == Placement::kCompact) {
    UBEP_CHECK_ARG(a.x.ndim == 2 && a.x.dim(0) == num_recv_rows_, what, ": x must be [",
                   num_recv_rows_, ", ", cfg_.hidden, "] (one row per received row), got ",
                   a.x.describe());
    a.x.shape[0] = cap.recv_x.dim(0);
    // No rows received: nothing is read, and an empty tensor may have no address.
    if (num_recv_rows_ == 0 && a.x.data == nullptr) a.x.data = seq_.combine_buffer(0).data;
  }
  const TensorView w = a.topk_weights;
  if (w.ndim != 0) {
    UBEP_CHECK_ARG(layout_ == Layout::kLatency, what,
                   ": topk_weights can only replace the dispatch's in the latency layout");
    UBEP_CHECK_ARG(w.device == cfg_.device, what, ": topk_weights is on ", w.device.describe(),
                   ", the buffer on ", cfg_.device.describe());
    UBEP_CHECK_ARG(w.ndim == 2 && w.dtype == DType::kFP32 && w.dim(0) == tokens_ &&
                       w.dim(1) == topk_ && (w.data != nullptr || w.numel() == 0),
                   what, ": topk_weights must be fp32 [", tokens_, ", ", topk_,
                   "] like the dispatch's topk_idx, got ", w.describe());
    a.topk_weights = {};  // the kernels read the weights from this rank's scratch
  }
  cuda_hd::LaunchParams p = seq_.combine({&a, 1}, phases, res_);
  // Replacing the dispatch's weights (DeepEP's low_latency_combine takes them here): only the
  // owner reads them, in its combine receive, so they go into its scratch now.
  if (w.ndim != 0 && w.numel() > 0)
    ops_->copy(seq_.scratch_map().at<char>(scratch_, seq_.scratch_map().w), w.data, w.bytes());
  return p;
}

void KernelEngine::launch_combine(const CombineArgs* args, uint32_t phases, const char* what) {
  cuda_hd::LaunchParams p;
  if (args) {
    machine_.start(what);
    machine_.accept(what, [&] { p = combine_params(*args, phases, what); });
    machine_.mark_combined();
  } else {
    p = seq_.combine({}, phases, res_);
  }
  arm(p);
  stats_ = {};
  if (seq_.algorithm == Algorithm::kBsp) stats_.barriers = 1;
  try {
    ops_->launch_combine(p, bpr_, threads_);
  } catch (const std::exception& e) {
    break_call(what, e);
  }
}

int64_t KernelEngine::sum_recv_count() const {
  const int El = cfg_.num_experts / ranks_;
  std::vector<int64_t> counts(static_cast<size_t>(El));
  ops_->copy(counts.data(), seq_.scratch_map().at<char>(scratch_, seq_.scratch_map().recv_count),
             counts.size() * sizeof(int64_t));
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

// The views of the last dispatch. Compact throughput rows are shaped by their count once the
// call is complete, as on the host backend.
DispatchResult KernelEngine::result() const {
  DispatchResult r = seq_.results()[0];
  if (r.layout == Layout::kLatency) {
    r.num_recv_rows = 0;
    return r;
  }
  r.num_recv_rows = num_recv_rows_;
  if (r.placement == Placement::kCompact && num_recv_rows_ >= 0)
    for (TensorView* v : {&r.recv_x, &r.recv_topk_idx, &r.recv_topk_weights, &r.recv_src})
      v->shape[0] = num_recv_rows_;
  return r;
}

DispatchResult KernelEngine::dispatch(const DispatchArgs& args) {
  check_idle("dispatch");
  launch_dispatch(&args, cuda_hd::kSend | cuda_hd::kRecv, "dispatch");
  finish("dispatch");
  num_recv_rows_ = *recv_rows_;
  return result();
}

void KernelEngine::dispatch_send(const DispatchArgs& args) {
  protocol::CallMachine::require_split_phase("dispatch_send", seq_.algorithm);
  check_idle("dispatch_send");
  launch_dispatch(&args, cuda_hd::kSend, "dispatch_send");
  machine_.enter(Phase::kDispatchSent);
}

DispatchResult KernelEngine::dispatch_recv() {
  machine_.require_dispatch_sent("dispatch_recv");
  if (machine_.phase() == Phase::kDispatchSent) {
    launch_dispatch(nullptr, cuda_hd::kRecv, "dispatch_recv");
    finish("dispatch_recv");
    num_recv_rows_ = *recv_rows_;
  }
  machine_.enter(Phase::kIdle);
  return result();
}

// The receive hook per piece. The kernels have no per-(source, expert) signal the host can see,
// so the hook runs the whole receive (dispatch_recv's launch) and returns the piece's range:
// the rows are then there, as the contract says, though the hook waited for every source.
std::array<int64_t, 2> KernelEngine::wait_recv_range(int source, int local_expert) {
  machine_.require_dispatch_sent("wait_recv_range");
  protocol::check_recv_piece(source, local_expert, layout_, ranks_, cfg_.num_experts / ranks_);
  if (machine_.phase() == Phase::kDispatchSent) {
    launch_dispatch(nullptr, cuda_hd::kRecv, "wait_recv_range");
    finish("wait_recv_range");
    num_recv_rows_ = *recv_rows_;
    machine_.enter(Phase::kDispatchReceived);
  }
  std::array<int64_t, 2> range{};
  const auto index =
      cuda_hd::range_index(layout_ == Layout::kLatency, ranks_, local_expert, source);
  ops_->copy(range.data(),
             seq_.scratch_map().at<int64_t>(scratch_, seq_.scratch_map().recv_range) + 2 * index,
             sizeof range);
  return range;
}

DispatchResult KernelEngine::pending_dispatch() const {
  machine_.require_pending_latency_dispatch(layout_);
  return result();
}

TensorView KernelEngine::combine(const CombineArgs& args) {
  check_idle("combine");
  launch_combine(&args, cuda_hd::kCombSend | cuda_hd::kCombRecv, "combine");
  finish("combine");
  return seq_.outputs()[0];
}

void KernelEngine::combine_send(const CombineArgs& args) {
  protocol::CallMachine::require_split_phase("combine_send", seq_.algorithm);
  check_idle("combine_send");
  launch_combine(&args, cuda_hd::kCombSend, "combine_send");
  machine_.enter(Phase::kCombineSent);
}

TensorView KernelEngine::combine_recv() {
  machine_.require_combine_sent("combine_recv");
  machine_.enter(Phase::kIdle);
  launch_combine(nullptr, cuda_hd::kCombRecv, "combine_recv");
  finish("combine_recv");
  return seq_.outputs()[0];
}

TensorView KernelEngine::pending_combine() const {
  machine_.require_pending_combine("pending_combine");
  return seq_.outputs()[0];
}

TensorView KernelEngine::compact() {
  machine_.require_dispatch("compact");
  check_idle("compact");
  if (!compact_) {
    const protocol::WindowLayout& m = seq_.map();
    compact_ = static_cast<char*>(
        ops_->alloc_device(std::max<size_t>(static_cast<size_t>(m.comb_rows()) * m.row_bytes, 16)));
    seq_.set_compact_memory(0, compact_);
  }
  cuda_hd::LaunchParams p = seq_.compact(res_);
  arm(p);
  try {
    ops_->launch_dispatch(p, bpr_, threads_, smem_);
  } catch (const std::exception& e) {
    break_call("compact", e);
  }
  finish("compact");
  TensorView v = seq_.compacted()[0];
  // Latency: one row per (local expert, token), so the recv_count sum. Throughput: one row per
  // (token, rank) however many local experts it carries, so the rows received.
  v.shape[0] = layout_ == Layout::kLatency ? sum_recv_count() : num_recv_rows_;
  return v;
}

TensorView KernelEngine::compact_scales() const {
  UBEP_CHECK_ARG(false, "compact_scales: the buffer's dtype ", dtype_name(cfg_.dtype),
                 " has no scales (fp8 dispatch is not implemented by the CUDA kernels)");
  return {};
}

TensorView KernelEngine::combine_buffer() const {
  machine_.require_dispatch("combine_buffer");
  TensorView v = seq_.combine_buffer(0);  // shaped by capacity
  const DispatchResult r = result();      // shaped like recv_x (compact rows: by their count)
  if (r.layout == Layout::kThroughput) v.shape[0] = r.recv_x.dim(0);
  return v;
}

void KernelEngine::set_algorithm(Algorithm a) {
  UBEP_CHECK_ARG(machine_.idle(), "set_algorithm: a split-phase call is outstanding");
  seq_.algorithm = a;
  cfg_.algorithm = a;
}

void KernelEngine::set_sync_mode(SyncMode m) {
  UBEP_CHECK_ARG(machine_.idle(), "set_sync_mode: a split-phase call is outstanding");
  seq_.sync = m;
  cfg_.research.sync = m;
}

}  // namespace ubep::cuda_host
