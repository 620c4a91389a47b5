// The one logger of ubep: level from UBEP_LOG (error|warn|info|debug), default warn.
#pragma once

#include "ubep/error.hpp"

namespace ubep::log {

enum class Level { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

Level level();
void write(Level lvl, const std::string& msg);

template <typename... Args>
void warn(const Args&... a) {
  if (level() >= Level::kWarn) write(Level::kWarn, detail::concat(a...));
}
template <typename... Args>
void info(const Args&... a) {
  if (level() >= Level::kInfo) write(Level::kInfo, detail::concat(a...));
}
template <typename... Args>
void debug(const Args&... a) {
  if (level() >= Level::kDebug) write(Level::kDebug, detail::concat(a...));
}

}  // namespace ubep::log
