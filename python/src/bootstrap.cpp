// make_bootstrap_group over a Python object: the set-up collectives (allgather of segment and
// host names, barriers) are the framework's (torch.distributed all_gather_object on gloo,
// mpi4py's allgather), called back from C++ with the GIL taken; the data path never calls them.
#include <pybind11/pybind11.h>

#include <chrono>
#include <cstring>
#include <string>

#include "ubep/bootstrap.hpp"
#include "ubep/error.hpp"
#include "ubep/tcp_group.hpp"

namespace pb = pybind11;

namespace ubep::python {

namespace {

class PyBootstrap : public Bootstrap {
 public:
  explicit PyBootstrap(pb::object impl) : impl_(std::move(impl)) {
    rank_ = impl_.attr("rank")().cast<int>();
    size_ = impl_.attr("size")().cast<int>();
  }
  ~PyBootstrap() override {
    pb::gil_scoped_acquire gil;
    impl_ = pb::object();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allgather(const void* in, void* out, size_t bytes) override {
    pb::gil_scoped_acquire gil;
    pb::bytes all = impl_.attr("allgather")(pb::bytes(static_cast<const char*>(in), bytes));
    const std::string_view v = all;
    UBEP_CHECK(v.size() == bytes * static_cast<size_t>(size_), SystemError,
               "bootstrap allgather returned ", v.size(), " bytes, expected ",
               bytes * static_cast<size_t>(size_), " (", size_, " ranks x ", bytes, ")");
    std::memcpy(out, v.data(), v.size());
  }

  void barrier() override {
    pb::gil_scoped_acquire gil;
    impl_.attr("barrier")();
  }

 private:
  pb::object impl_;
  int rank_ = 0;
  int size_ = 0;
};

GroupOptions group_options(double timeout_s, const std::string& elastic_name, const char* what) {
  UBEP_CHECK_ARG(timeout_s > 0, what, ": timeout must be > 0 seconds, got ", timeout_s);
  GroupOptions o;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  o.elastic_name = elastic_name;
  return o;
}

}  // namespace

void bind_bootstrap(pb::module_& m) {
  m.def(
      "make_bootstrap_group",
      [](pb::object impl, double timeout_s, const std::string& elastic_name) {
        const GroupOptions o = group_options(timeout_s, elastic_name, "make_group");
        auto boot = std::make_shared<PyBootstrap>(std::move(impl));
        // Collective: the callbacks take the GIL back when they need it.
        pb::gil_scoped_release nogil;
        return make_bootstrap_group(boot, o);
      },
      pb::arg("bootstrap"), pb::arg("timeout") = 60.0, pb::arg("elastic_name") = "",
      "A Group of the processes of `bootstrap` (rank(), size(), allgather(bytes) -> bytes of "
      "all ranks in rank order, barrier()), which must all be on this host. elastic_name: "
      "GroupOptions::elastic_name (docs/ELASTIC.md), '' for none.");
  m.def(
      "make_rejoin_group",
      [](const std::string& elastic_name, int rank, double timeout_s) {
        const GroupOptions o = group_options(timeout_s, elastic_name, "make_rejoin_group");
        // Not collective: it maps the rendezvous segment and claims the rank.
        pb::gil_scoped_release nogil;
        return make_rejoin_group(elastic_name, rank, o);
      },
      pb::arg("elastic_name"), pb::arg("rank"), pb::arg("timeout") = 60.0,
      "The C++ make_rejoin_group: a new process takes rank `rank` of the live elastic group "
      "`elastic_name` on this host (docs/ELASTIC.md).");
  m.def(
      "make_tcp_group",
      [](const std::string& rendezvous, int hosts, int host, int ranks_per_host, int local_rank,
         double timeout_s, bool elastic, bool rejoin) {
        const GroupOptions o = group_options(timeout_s, "", "make_tcp_group");
        TcpLaunch launch;
        launch.rendezvous = rendezvous;
        launch.hosts = hosts;
        launch.host = host;
        launch.ranks_per_host = ranks_per_host;
        launch.local_rank = local_rank;
        launch.elastic = elastic;
        launch.rejoin = rejoin;
        // Collective over every rank of every host: sockets only, no Python callback.
        pb::gil_scoped_release nogil;
        return make_tcp_group(launch, o);
      },
      pb::arg("rendezvous"), pb::arg("hosts"), pb::arg("host"), pb::arg("ranks_per_host"),
      pb::arg("local_rank"), pb::arg("timeout") = 60.0, pb::arg("elastic") = false,
      pb::arg("rejoin") = false,
      "The C++ make_tcp_group (ubep/tcp_group.hpp): one launcher per host, no MPI job spanning "
      "hosts, so the survivors outlive a lost host (docs/ELASTIC.md). elastic: the live group "
      "takes replacement hosts (TcpLaunch::elastic); rejoin: this rank belongs to a replacement "
      "host (TcpLaunch::rejoin; not collective with the live ranks).");
}

}  // namespace ubep::python
