// ubep-oneccl-bench: the all-to-all-v dispatch/combine a CPU user writes with oneCCL (Intel's
// collectives, PyPI oneccl-cpu-devel), timed against the same code on MPI_Alltoallv in the same
// processes, on ubep-bench's shapes. Run under mpirun; compare with ubep-bench run the same way
// (docs/INTEGRATIONS.md, "oneCCL").
//
//   mpirun -np 2 build/tools/ubep-oneccl-bench --workload decode
//
// Per call, as users write it: dispatch = pack one row per (token, destination rank) in rank
// order -> all-to-all of the row counts -> all-to-all-v of the rows (bf16) and of their weight
// sums; the identity expert (untimed); combine = each row scaled by the sum of its token's
// weights for that rank's experts (fp32, one rounding to bf16) -> all-to-all-v back -> the
// owner sums its rows in rank order in fp32 and rounds once. Every timed call starts after an
// MPI_Barrier; a call's time is the slowest rank's. Both transports must give the same y, and y
// must equal the same sums computed locally (checked every run).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/ccl.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even (inputs are finite)
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Shape {
  int tokens = 128, hidden = 7168, experts = 256, topk = 8, iters = 50, warmup = 5;
};

struct Workload {
  std::vector<uint16_t> x;      // [tokens, hidden]
  std::vector<int> dest_rows;   // per token: the destination ranks, ascending (flattened)
  std::vector<int> dest_begin;  // tokens + 1 offsets into dest_rows / wsum
  std::vector<float> wsum;      // per (token, destination): sum of its weights there
};

Workload make_workload(const Shape& s, int rank, int ranks) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> u(-1.f, 1.f), w(0.f, 1.f);
  Workload wl;
  wl.x.resize(static_cast<size_t>(s.tokens) * s.hidden);
  for (auto& v : wl.x) v = to_bf16(u(gen));
  const int per_rank = s.experts / ranks;
  std::vector<int> ids(s.experts);
  wl.dest_begin.push_back(0);
  for (int t = 0; t < s.tokens; ++t) {
    for (int e = 0; e < s.experts; ++e) ids[e] = e;
    std::shuffle(ids.begin(), ids.end(), gen);  // top-k: k distinct experts
    std::vector<float> per_dest(ranks, 0.f);
    std::vector<bool> hit(ranks, false);
    for (int k = 0; k < s.topk; ++k) {
      per_dest[ids[k] / per_rank] += w(gen);
      hit[ids[k] / per_rank] = true;
    }
    for (int r = 0; r < ranks; ++r)
      if (hit[r]) wl.dest_rows.push_back(r), wl.wsum.push_back(per_dest[r]);
    wl.dest_begin.push_back(static_cast<int>(wl.dest_rows.size()));
  }
  return wl;
}

// One transport: MPI_Alltoallv or ccl::alltoallv, both on bytes / int64.
struct Transport {
  std::string name;
  MPI_Comm mpi = MPI_COMM_NULL;
  ccl::communicator* ccl = nullptr;

  void counts(const std::vector<int64_t>& send, std::vector<int64_t>& recv) const {
    if (ccl) {
      ccl::alltoall(send.data(), recv.data(), 1, ccl::datatype::int64, *ccl).wait();
    } else {
      MPI_Alltoall(send.data(), 1, MPI_INT64_T, recv.data(), 1, MPI_INT64_T, mpi);
    }
  }
  void bytes(const void* send, const std::vector<int64_t>& sc, void* recv,
             const std::vector<int64_t>& rc) const {
    const size_t n = sc.size();
    if (ccl) {
      std::vector<size_t> s(sc.begin(), sc.end()), r(rc.begin(), rc.end());
      ccl::alltoallv(static_cast<const int8_t*>(send), s, static_cast<int8_t*>(recv), r, *ccl)
          .wait();
      return;
    }
    std::vector<int> s(n), r(n), sd(n, 0), rd(n, 0);
    for (size_t p = 0; p < n; ++p) {
      s[p] = static_cast<int>(sc[p]);
      r[p] = static_cast<int>(rc[p]);
    }
    for (size_t p = 1; p < n; ++p) {
      sd[p] = sd[p - 1] + s[p - 1];
      rd[p] = rd[p - 1] + r[p - 1];
    }
    MPI_Alltoallv(send, s.data(), sd.data(), MPI_BYTE, recv, r.data(), rd.data(), MPI_BYTE, mpi);
  }
};

struct State {
  std::vector<int64_t> send_rows, recv_rows;  // per rank
  std::vector<uint16_t> send_x, recv_x, back;
  std::vector<float> send_w, recv_w;
  std::vector<int> order;  // send row -> (token) in rank order
  std::vector<uint16_t> y;
};

std::vector<int64_t> scaled(const std::vector<int64_t>& rows, size_t bytes) {
  std::vector<int64_t> out(rows);
  for (auto& v : out) v *= static_cast<int64_t>(bytes);
  return out;
}

void dispatch(const Transport& tr, const Shape& s, const Workload& wl, int ranks, State& st) {
  const size_t H = s.hidden;
  st.send_rows.assign(ranks, 0);
  for (int d : wl.dest_rows) st.send_rows[d]++;
  std::vector<int64_t> at(ranks, 0);
  for (int r = 1; r < ranks; ++r) at[r] = at[r - 1] + st.send_rows[r - 1];
  const size_t rows = wl.dest_rows.size();
  st.send_x.resize(rows * H), st.send_w.resize(rows), st.order.resize(rows);
  for (int t = 0; t < s.tokens; ++t)
    for (int i = wl.dest_begin[t]; i < wl.dest_begin[t + 1]; ++i) {
      const int64_t row = at[wl.dest_rows[i]]++;
      std::memcpy(&st.send_x[row * H], &wl.x[t * H], H * 2);
      st.send_w[row] = wl.wsum[i], st.order[row] = t;
    }
  st.recv_rows.assign(ranks, 0);
  tr.counts(st.send_rows, st.recv_rows);
  int64_t in = 0;
  for (auto v : st.recv_rows) in += v;
  st.recv_x.resize(in * H), st.recv_w.resize(in);
  tr.bytes(st.send_x.data(), scaled(st.send_rows, H * 2), st.recv_x.data(),
           scaled(st.recv_rows, H * 2));
  tr.bytes(st.send_w.data(), scaled(st.send_rows, 4), st.recv_w.data(), scaled(st.recv_rows, 4));
}

void combine(const Transport& tr, const Shape& s, State& st) {
  const size_t H = s.hidden;
  const size_t in = st.recv_w.size();
  for (size_t r = 0; r < in; ++r)  // expert side: the weighted sum of this rank's experts
    for (size_t h = 0; h < H; ++h)
      st.recv_x[r * H + h] = to_bf16(from_bf16(st.recv_x[r * H + h]) * st.recv_w[r]);
  st.back.resize(st.send_x.size());
  tr.bytes(st.recv_x.data(), scaled(st.recv_rows, H * 2), st.back.data(),
           scaled(st.send_rows, H * 2));
  std::vector<float> acc(static_cast<size_t>(s.tokens) * H, 0.f);
  for (size_t row = 0; row < st.order.size(); ++row)  // rows are in rank order: sums in rank order
    for (size_t h = 0; h < H; ++h) acc[st.order[row] * H + h] += from_bf16(st.back[row * H + h]);
  st.y.resize(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) st.y[i] = to_bf16(acc[i]);
}

// y as the owner would compute it with every expert local: the same sums, no transport.
std::vector<uint16_t> reference(const Shape& s, const Workload& wl) {
  const size_t H = s.hidden;
  std::vector<uint16_t> y(static_cast<size_t>(s.tokens) * H);
  for (int t = 0; t < s.tokens; ++t)
    for (size_t h = 0; h < H; ++h) {
      float a = 0.f;
      for (int i = wl.dest_begin[t]; i < wl.dest_begin[t + 1]; ++i)
        a += from_bf16(to_bf16(from_bf16(wl.x[t * H + h]) * wl.wsum[i]));
      y[t * H + h] = to_bf16(a);
    }
  return y;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Stat {
  double median, p99;
};
Stat stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2],
          v[std::min(v.size() - 1, static_cast<size_t>(0.99 * (v.size() - 1) + 0.5))]};
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, ranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Shape s;
  std::string workload = "decode";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--workload")
      workload = argv[i + 1];
    else if (a == "--iters")
      s.iters = v;
    else if (a == "--warmup")
      s.warmup = v;
    else if (a == "--tokens")
      s.tokens = v;
    else if (a == "--hidden")
      s.hidden = v;
    else {
      if (rank == 0) std::fprintf(stderr, "ubep-oneccl-bench: unknown option %s\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (workload == "prefill")
    s.tokens = 4096, s.iters = std::min(s.iters, 10);
  else if (workload != "decode") {
    if (rank == 0)
      std::fprintf(stderr, "ubep-oneccl-bench: --workload decode|prefill, got %s\n",
                   workload.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  if (s.experts % ranks) MPI_Abort(MPI_COMM_WORLD, 2);
  ccl::init();
  ccl::kvs::address_type addr{};
  ccl::shared_ptr_class<ccl::kvs> kvs;
  if (rank == 0) kvs = ccl::create_main_kvs(), addr = kvs->get_address();
  MPI_Bcast(addr.data(), static_cast<int>(addr.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(addr);
  auto comm = ccl::create_communicator(ranks, rank, kvs);
  const Workload wl = make_workload(s, rank, ranks);
  const std::vector<uint16_t> ref = reference(s, wl);
  Transport trs[2] = {{"mpi", MPI_COMM_WORLD, nullptr}, {"oneccl", MPI_COMM_NULL, &comm}};
  std::vector<double> t[2][2];
  bool ok = true;
  State states[2];  // buffers reused across calls, as a user's would be
  for (int it = 0; it < s.warmup + s.iters; ++it) {
    for (int k = 0; k < 2; ++k) {  // alternate transports each iteration: same load for both
      State& st = states[k];
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = now_us();
      dispatch(trs[k], s, wl, ranks, st);
      double d = now_us() - t0;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = now_us();
      combine(trs[k], s, st);
      double c = now_us() - t0;
      ok = ok && st.y == ref;
      double mine[2] = {d, c}, worst[2];
      MPI_Allreduce(mine, worst, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (it >= s.warmup) t[k][0].push_back(worst[0]), t[k][1].push_back(worst[1]);
    }
  }
  int all_ok = ok, every = 0;
  MPI_Allreduce(&all_ok, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf(
        "ubep-oneccl-bench: %s, %d ranks, %d tokens, hidden %d, top-%d of %d, bf16, "
        "%d iterations; y equals the local reference on every rank: %s\n",
        workload.c_str(), ranks, s.tokens, s.hidden, s.topk, s.experts, s.iters,
        every ? "yes" : "NO");
    std::printf("%-8s %22s %22s %12s\n", "impl", "dispatch us (p99)", "combine us (p99)", "sum us");
    for (int k = 0; k < 2; ++k) {
      const Stat d = stats(t[k][0]), c = stats(t[k][1]);
      std::printf("%-8s %12.1f (%7.1f) %12.1f (%7.1f) %12.1f\n", trs[k].name.c_str(), d.median,
                  d.p99, c.median, c.p99, d.median + c.median);
    }
  }
  MPI_Finalize();
  return every ? 0 : 1;
}
