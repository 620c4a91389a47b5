#include "core/log.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ubep::log {

Level level() {
  static const Level lvl = [] {
    const char* env = std::getenv("UBEP_LOG");
    if (!env) return Level::kWarn;
    if (!std::strcmp(env, "error")) return Level::kError;
    if (!std::strcmp(env, "info")) return Level::kInfo;
    if (!std::strcmp(env, "debug")) return Level::kDebug;
    return Level::kWarn;
  }();
  return lvl;
}

void write(Level lvl, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"error", "warn", "info", "debug"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[ubep %s] %s\n", names[static_cast<int>(lvl)], msg.c_str());
}

}  // namespace ubep::log
