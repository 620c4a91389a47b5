// Temporary files of the simulator's tests: named per process, since ctest runs every test case
// as its own process, two at once (a name shared between processes let one test read another's
// half-written calibration), and removed when the process ends.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>
#include <set>
#include <string>

namespace ubep::sim::test {

class TempFiles {
 public:
  static std::string path(const std::string& name) {
    static TempFiles files;
    const std::string p =
        ::testing::TempDir() + "ubep-sim-" + std::to_string(getpid()) + "-" + name;
    std::lock_guard<std::mutex> lock(files.mu_);
    files.paths_.insert(p);
    return p;
  }
  ~TempFiles() {
    for (const std::string& p : paths_) std::remove(p.c_str());
  }

 private:
  std::mutex mu_;
  std::set<std::string> paths_;
};

inline std::string temp_path(const std::string& name) { return TempFiles::path(name); }

}  // namespace ubep::sim::test
