#include "backend/factory/factory.hpp"
#include "core/enum_names.hpp"
#include "ep/config_agreement.hpp"
#include "ep/host_engine.hpp"
#include "ubep/error.hpp"

namespace ubep {

namespace {
constexpr detail::EnumName<Algorithm> kAlgorithms[] = {{Algorithm::kBsp, "bsp"},
                                                       {Algorithm::kUbep, "ubep"}};
constexpr detail::EnumName<Layout> kLayouts[] = {{Layout::kThroughput, "throughput"},
                                                 {Layout::kLatency, "latency"}};
constexpr detail::EnumName<Placement> kPlacements[] = {{Placement::kAuto, "auto"},
                                                       {Placement::kCompact, "compact"},
                                                       {Placement::kPerSource, "per-source"}};
}  // namespace

const char* algorithm_name(Algorithm a) { return detail::enum_name(kAlgorithms, a); }
Algorithm parse_algorithm(const std::string& n) {
  return detail::parse_enum(kAlgorithms, n, "algorithm");
}
const char* layout_name(Layout l) { return detail::enum_name(kLayouts, l); }
Layout parse_layout(const std::string& n) { return detail::parse_enum(kLayouts, n, "layout"); }
const char* placement_name(Placement p) { return detail::enum_name(kPlacements, p); }
Placement parse_placement(const std::string& n) {
  return detail::parse_enum(kPlacements, n, "placement");
}
DType combine_dtype(const BufferConfig& c) {
  return c.dtype == DType::kFP8E4M3 ? DType::kBF16 : c.dtype;
}
Placement placement_for(Layout layout) {
  // Measured (docs/SEMANTICS.md, "Placement"): see there for why each layout gets its default.
  return layout == Layout::kLatency ? Placement::kPerSource : Placement::kCompact;
}

// ---- Buffer: the one front, over the engine the factory picked for the device ------------------

struct Buffer::Impl {
  std::unique_ptr<backend::Engine> engine;
};

namespace {
std::unique_ptr<backend::Engine> make_engine(Group& group, const BufferConfig& requested) {
  const BufferConfig cfg = ep::agree_on_config(group, requested);  // collective: same on all ranks
  if (backend::runs_kernels(cfg.device)) return backend::make_kernel_engine(group, cfg);
  return std::make_unique<ep::HostEngine>(group, cfg, backend::make_data_path(cfg));
}
}  // namespace

Buffer::Buffer(Group& group, BufferConfig config)
    : impl_(std::make_unique<Impl>(Impl{make_engine(group, config)})) {}
Buffer::~Buffer() = default;

DispatchResult Buffer::dispatch(const DispatchArgs& args) { return impl_->engine->dispatch(args); }
TensorView Buffer::combine(const CombineArgs& args) { return impl_->engine->combine(args); }
void Buffer::dispatch_send(const DispatchArgs& args) { impl_->engine->dispatch_send(args); }
DispatchResult Buffer::dispatch_recv() { return impl_->engine->dispatch_recv(); }
void Buffer::combine_send(const CombineArgs& args) { impl_->engine->combine_send(args); }
TensorView Buffer::combine_recv() { return impl_->engine->combine_recv(); }
std::array<int64_t, 2> Buffer::wait_recv_range(int source, int local_expert) {
  return impl_->engine->wait_recv_range(source, local_expert);
}
DispatchResult Buffer::pending_dispatch() const { return impl_->engine->pending_dispatch(); }
TensorView Buffer::pending_combine() const { return impl_->engine->pending_combine(); }
TensorView Buffer::compact() { return impl_->engine->compact(); }
TensorView Buffer::compact_scales() const { return impl_->engine->compact_scales(); }
TensorView Buffer::combine_buffer() const { return impl_->engine->combine_buffer(); }
const BufferConfig& Buffer::config() const { return impl_->engine->config(); }
Group& Buffer::group() { return impl_->engine->group(); }
int Buffer::num_local_experts() const {
  return impl_->engine->config().num_experts / impl_->engine->group().size();
}
int Buffer::num_workers() const { return impl_->engine->num_workers(); }
void Buffer::mask(int rank) { impl_->engine->mask(rank); }
std::vector<int> Buffer::masked_ranks() const { return impl_->engine->masked_ranks(); }
void Buffer::rejoin() { impl_->engine->rejoin(); }
void Buffer::set_algorithm(Algorithm a) { impl_->engine->set_algorithm(a); }

void backend::Engine::mask(int rank) {
  throw InvalidArgument(detail::concat("mask(", rank, "): masking ranks is not supported on ",
                                       config().device.describe(), " buffers (CPU only)"));
}
void backend::Engine::rejoin() {
  throw InvalidArgument(detail::concat("rejoin: not supported on ", config().device.describe(),
                                       " buffers (CPU only)"));
}
void Buffer::set_sync_mode(SyncMode m) { impl_->engine->set_sync_mode(m); }
const CallStats& Buffer::last_stats() const { return impl_->engine->last_stats(); }
size_t Buffer::shared_bytes() const { return impl_->engine->shared_bytes(); }

}  // namespace ubep
