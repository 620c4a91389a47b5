// Two-process smoke test of the CUDA IPC path of ubep::Buffer (label gpu): the process forks
// before touching CUDA, the two processes find each other through a Bootstrap over a socketpair
// and make a process Group of it (make_bootstrap_group); each builds a Buffer on cuda:0 (or
// cuda:rank when there are two GPUs) -- the peers' windows then travel as CUDA IPC handles --
// and runs dispatch + combine in both layouts, both placements (compact, per-source), ubep
// (split phase) and bsp, checked bit for bit against the reference. Exit 77 (skipped) without a
// GPU, as the GPU tests do.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>

#include "gpu_support.hpp"
#include "ubep/bootstrap.hpp"
#include "ubep/buffer.hpp"
#include "ubep/cuda.hpp"

using namespace ubep;
using namespace ubep::gpu_test;

namespace {

// Bootstrap of two processes over a connected socket pair.
class PairBootstrap final : public Bootstrap {
 public:
  PairBootstrap(int rank, int fd) : rank_(rank), fd_(fd) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void allgather(const void* in, void* out, size_t bytes) override {
    char* o = static_cast<char*>(out);
    std::memcpy(o + static_cast<size_t>(rank_) * bytes, in, bytes);
    io(true, in, bytes);
    io(false, o + static_cast<size_t>(1 - rank_) * bytes, bytes);
  }
  void barrier() override {
    char a = 1, b[2];
    allgather(&a, b, 1);
  }
  std::vector<int> host_map() override { return {0, 0}; }

 private:
  void io(bool send, const void* p, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t k =
          send ? ::write(fd_, static_cast<const char*>(p) + done, n - done)
               : ::read(fd_, const_cast<char*>(static_cast<const char*>(p)) + done, n - done);
      if (k <= 0) throw std::runtime_error("bootstrap socket closed");
      done += static_cast<size_t>(k);
    }
  }
  int rank_, fd_;
};

BufferConfig smoke_config(Algorithm algo, Placement placement, int device) {
  BufferConfig cfg;
  cfg.device = {DeviceType::kCuda, device};
  cfg.max_tokens_per_rank = 32;
  cfg.hidden = 512;
  cfg.num_experts = 8;
  cfg.max_topk = 4;
  cfg.algorithm = algo;
  cfg.placement = placement;
  return cfg;
}

// Three calls on one Buffer, each checked: dispatch (split phase for ubep), the reference's
// expert function written into combine_buffer() (zero-copy), combine.
void run_smoke_case(Group& group, const BufferConfig& cfg, Layout layout) {
  const int rank = group.rank();
  Buffer buf(group, cfg);
  for (int call = 0; call < 3; ++call) {
    const test::Problem p =
        test::make_problem(2, 8, cfg.hidden, cfg.dtype, {32, 17 + call}, 4,
                           test::Routing::kWithDrops, 77u + static_cast<unsigned>(call));
    RankInputs in(p, rank, layout);
    for (TensorView* v : {&in.args.x, &in.args.topk_idx, &in.args.topk_weights})
      v->device = cfg.device;
    const DispatchResult r = cfg.algorithm == Algorithm::kUbep
                                 ? (buf.dispatch_send(in.args), buf.dispatch_recv())
                                 : buf.dispatch(in.args);
    const std::vector<char> comb =
        check_dispatch(p, rank, r, r.num_recv_rows, 4, 64, 4, nullptr, ResultRows::kAsBuffer);
    const CombineArgs ca{buf.combine_buffer(), r.handle};
    upload(ca.x.data, comb.data(), comb.size());
    check_combine(p, rank, buf.combine(ca), test::expected_combine(p, rank, layout));
  }
}

int run_rank(int rank, int fd) {
  std::string why;
  if (!cuda::device_available(&why)) {
    if (rank == 0)
      std::cout << "SKIPPED: no usable CUDA device (" << why << "); IPC smoke test did not run\n";
    return kSkip;
  }
  int devices = 0;
  ck(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  const int device = devices > 1 ? rank : 0;
  ck(cudaSetDevice(device), "cudaSetDevice");
  auto boot = std::make_shared<PairBootstrap>(rank, fd);
  GroupOptions options;
  options.timeout = std::chrono::seconds(20);  // both processes may time-slice one GPU
  std::unique_ptr<Group> group = make_bootstrap_group(boot, options);
  int failed = 0;
  for (Algorithm algo : {Algorithm::kUbep, Algorithm::kBsp})
    for (Layout layout : {Layout::kThroughput, Layout::kLatency})
      for (Placement placement : {Placement::kCompact, Placement::kPerSource}) {
        const std::string name = std::string(algorithm_name(algo)) + ", " + layout_name(layout) +
                                 ", " + placement_name(placement);
        try {
          run_smoke_case(*group, smoke_config(algo, placement, device), layout);
          std::cout << "rank " << rank << " PASS " << name << "\n";
        } catch (const std::exception& e) {
          ++failed;
          std::cout << "rank " << rank << " FAIL " << name << ": " << e.what() << "\n";
        }
      }
  return failed ? 1 : 0;
}

}  // namespace

int main() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    close(sv[0]);
    _exit(run_rank(1, sv[1]));
  }
  close(sv[1]);
  const int mine = run_rank(0, sv[0]);
  int status = 0;
  waitpid(child, &status, 0);
  const int theirs = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (mine == kSkip && theirs == kSkip) return kSkip;
  const bool ok = mine == 0 && theirs == 0;
  std::cout << (ok ? "IPC smoke test PASSED" : "IPC smoke test FAILED") << "\n";
  return ok ? 0 : 1;
}
