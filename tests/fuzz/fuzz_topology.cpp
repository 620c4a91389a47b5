// libFuzzer target: the topology reader (src/sched/topology_json.cpp) on arbitrary text, the file
// users write for their own pod (docs/sim/TOPOLOGY.md). Every input must give a topology that
// keeps the model's invariants, or InvalidArgument; never another exception, a crash (the
// sanitizers watch) or a hang. The first byte picks the caller's rank count (0 = from the file).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ubep/error.hpp"
#include "ubep/topology.hpp"

namespace {

[[noreturn]] void finding(const std::string& what, const std::string& text) {
  std::fprintf(stderr, "fuzz_topology: %s\ninput:\n%s\n", what.c_str(), text.c_str());
  std::abort();
}

// What every topology the reader accepts must satisfy.
void check(const ubep::sched::Topology& t, const std::string& text) {
  const int n = t.ranks(), levels = t.num_levels();
  if (n < 1 || levels < 2) finding("accepted a topology without ranks or levels", text);
  for (int l = 0; l < levels; ++l)
    if (!(t.level(l).bandwidth_gbps > 0) || !(t.level(l).latency_ns >= 0))
      finding("accepted a level with bandwidth <= 0 or latency < 0", text);
  const int probe = n < 64 ? n : 64;  // the invariants on the first ranks (bounded work)
  for (int a = 0; a < probe; ++a) {
    if (t.level_between(a, a) != 0) finding("a rank is not at level 0 of itself", text);
    for (int b = 0; b < probe; ++b) {
      const int l = t.level_between(a, b);
      if (l != t.level_between(b, a)) finding("level_between is not symmetric", text);
      if (a != b && (l < 1 || l >= levels)) finding("two ranks at level 0 or past the top", text);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;
  const int ranks = data[0] % 5 == 0 ? 0 : data[0] % 97;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  try {
    check(ubep::sched::from_json_text(text, ranks, "fuzz.json"), text);
  } catch (const ubep::InvalidArgument&) {
    // The documented answer to bad input.
  } catch (const std::exception& e) {
    finding(std::string("unexpected exception: ") + e.what(), text);
  }
  return 0;
}
