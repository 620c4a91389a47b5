// ep::HostEngine: construction, departure, and the views a call returns (host_engine.hpp says
// where the rest is).
#include "ep/host_engine.hpp"
#include "ep/config_agreement.hpp"

#include "bootstrap/death_watch.hpp"
#include "bootstrap/group_hooks.hpp"
#include "core/log.hpp"
#include "ep/exchange_context.hpp"
#include "ubep/error.hpp"

namespace ubep::ep {

namespace {
std::unique_ptr<HostRelay> make_relay(Group& g, const BufferConfig& cfg, Window& window) {
  if (g.num_hosts() == 1) return nullptr;
  UBEP_CHECK_ARG(bootstrap::hooks_of(g).remote() != nullptr, "Buffer: the group spans ",
                 g.num_hosts(), " hosts but has no transport between them");
  return std::make_unique<HostRelay>(g, cfg, window);
}

protocol::WindowLayout window_layout(const BufferConfig& cfg, int ranks) {
  return protocol::WindowLayout(protocol::row_codec(cfg.dtype, cfg.hidden),
                                static_cast<size_t>(cfg.hidden) * dtype_size(combine_dtype(cfg)),
                                ranks, cfg.num_experts / ranks, cfg.max_topk,
                                cfg.max_tokens_per_rank, cfg.enable_latency_layout);
}
}  // namespace

HostEngine::HostEngine(Group& g, const BufferConfig& c,
                       std::unique_ptr<backend::DataPath> data_path)
    : group_(g),
      cfg_(c),  // agreed across the group by Buffer (agree_on_config)
      combine_dtype_(combine_dtype(cfg_)),
      rank_(g.rank()),
      ranks_(g.size()),
      local_experts_(cfg_.num_experts / g.size()),
      max_tokens_(cfg_.max_tokens_per_rank),
      data_path_(std::move(data_path)),
      window_(g, window_layout(cfg_, g.size()), *data_path_, cfg_.initial_epoch),
      call_(g.rank(), cfg_, g.size()),
      machine_(
          g.rank(), g.size(),
          [this](int r) {
            if (call_.masked(r)) return 0u;
            return window_.peer(r) ? window_.failure_of(r) : members_.remote_failure(r);
          },
          // Host-mates through their windows, the other hosts by a notice (issue 32). The
          // ledger calls these only after construction (members_ is made after machine_).
          [this](uint32_t word) {
            window_.publish_failure(rank_, word);
            members_.tell_failure(word);
          }),
      members_(g, window_, config_digest(cfg_)),
      watch_(window_, members_, g.rank()),
      relay_(make_relay(g, cfg_, window_)),
      waiter_(g, watch_, relay_.get(), &members_),
      reducer_(g, cfg_, *data_path_, window_, waiter_, relay_.get()) {
  window_.set_sync(cfg_.research.sync);
  // Virtual until touched (MAP_NORESERVE): costs nothing unless compact() is used.
  const auto most_rows = static_cast<size_t>(window_.map().comb_rows());
  compacted_ = LocalArray(most_rows * codec().payload_bytes);
  if (codec().scale_bytes) {
    compacted_scales_ = LocalArray(most_rows * codec().scale_bytes);
    cast_x_ = LocalArray(static_cast<size_t>(max_tokens_) * codec().payload_bytes);
    cast_scales_ = LocalArray(static_cast<size_t>(max_tokens_) * codec().scale_bytes);
  }
  stats_.stage_us.reserve(16);
  watch_deaths();
  // Across hosts, with masking: one agreement with the group's other such Buffers, and a
  // replacement host taken by this Buffer only once the others have its records too.
  if (!g.single_host() && cfg_.mask_dead_ranks && members_.can_mask_hosts()) {
    agreement_ = GroupAgreement::join(g, this);
    members_.set_joint_replaced([this](int r) { return agreement_->replaced_elsewhere(r, this); });
  }
  const ExchangeContext ctx{group_,  cfg_,     *data_path_,  window_,
                            waiter_, reducer_, relay_.get(), stats_};
  bsp_exchange_ = make_bsp(ctx);
  ubep_exchange_ = make_ubep(ctx);
  log::info("rank ", rank_, ": buffer with ", window_.bytes(), " shared bytes, ", cfg_.num_workers,
            " workers, algorithm ", algorithm_name(cfg_.algorithm));
}

// A host-mate's process that dies publishes nothing, so this rank writes its failure word on its
// behalf, into its own window (the dead rank wrote its slot last; nobody else writes it): every
// wait of this buffer polls that word, so a call waiting on the dead rank ends within a poll of
// the death (the watch thread's store, the waiter's acquire load).
void HostEngine::watch_deaths() {
  bootstrap::DeathWatch* deaths = bootstrap::hooks_of(group_).death_watch();
  if (!deaths) return;
  death_subscription_ = deaths->subscribe([this](int r) {
    // A rank that departed cleanly (its Buffer's destructor published a break after its last
    // call) keeps that word: peers still finishing that call have its part.
    if (!protocol::is_broken(window_.failure_of(r))) window_.set_failure_of(r, protocol::kDeadWord);
  });
  for (int r = 0; r < ranks_; ++r)  // dead before this buffer was made
    if (r != rank_ && deaths->dead(r) && !protocol::is_broken(window_.failure_of(r)))
      window_.set_failure_of(r, protocol::kDeadWord);
}

HostEngine::~HostEngine() {
  if (agreement_) agreement_->leave(this);
  if (death_subscription_ >= 0)
    bootstrap::hooks_of(group_).death_watch()->unsubscribe(death_subscription_);
  // Departure (CallLedger::depart says which call the word names). The peers' windows stay
  // valid for this store: thread windows are shared by the group, process windows stay mapped
  // by every rank until its own Buffer goes.
  machine_.depart();
}

DispatchResult HostEngine::result(const Arrivals& arrivals) const {
  DispatchResult r;
  const Layout layout = call_.layout();
  const protocol::WindowLayout& map = window_.map();
  r.layout = layout;
  r.handle = dispatch_seq_;
  const int64_t topk = call_.routing().topk;
  const auto scales = static_cast<int64_t>(codec().scale_bytes / sizeof(float));
  const auto at = [&](size_t region) { return window_.at<char>(rank_, region); };
  r.recv_count =
      TensorView(const_cast<int64_t*>(arrivals.recv_count), DType::kInt64, {local_experts_});
  r.placement = call_.placement();
  if (layout == Layout::kThroughput) {
    const int64_t span = call_.throughput_span();
    r.num_recv_rows = arrivals.num_recv_rows;
    r.recv_x = TensorView(at(map.tp_x), cfg_.dtype, {span, cfg_.hidden});
    if (scales) r.recv_x_scales = TensorView(at(map.tp_scale), DType::kFP32, {span, scales});
    r.recv_topk_idx = TensorView(at(map.tp_idx), DType::kInt32, {span, topk});
    r.recv_topk_weights = TensorView(at(map.tp_w), DType::kFP32, {span, topk});
    r.recv_src = TensorView(at(map.tp_src), DType::kInt64, {span, 2});
    r.recv_range =
        TensorView(const_cast<int64_t*>(arrivals.recv_range), DType::kInt64, {ranks_, 2});
  } else {
    const int64_t slots = call_.expert_slots();
    r.recv_range = TensorView(const_cast<int64_t*>(arrivals.recv_range), DType::kInt64,
                              {local_experts_, ranks_, 2});
    r.recv_x = TensorView(at(map.lat_x), cfg_.dtype, {local_experts_, slots, cfg_.hidden});
    if (scales)
      r.recv_x_scales =
          TensorView(at(map.lat_scale), DType::kFP32, {local_experts_, slots, scales});
    r.recv_src = TensorView(at(map.lat_src), DType::kInt64, {local_experts_, slots, 2});
  }
  return r;
}

TensorView HostEngine::combine_input_view() const {
  char* base = window_.at<char>(rank_, window_.map().comb_x);
  if (call_.layout() == Layout::kThroughput)
    return TensorView(base, combine_dtype_, {call_.throughput_span(), cfg_.hidden});
  return TensorView(base, combine_dtype_, {local_experts_, call_.expert_slots(), cfg_.hidden});
}

TensorView HostEngine::combine_buffer() const {
  machine_.require_dispatch("combine_buffer");
  return combine_input_view();
}

void HostEngine::set_algorithm(Algorithm a) {
  UBEP_CHECK_ARG(machine_.idle(), "set_algorithm: a split-phase call is outstanding");
  cfg_.algorithm = a;
}

void HostEngine::set_sync_mode(SyncMode m) {
  UBEP_CHECK_ARG(machine_.idle(), "set_sync_mode: a split-phase call is outstanding");
  cfg_.research.sync = m;
  window_.set_sync(m);
}

}  // namespace ubep::ep
