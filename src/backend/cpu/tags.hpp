// Epoch tags on the CPU: a release store publishes, an acquire load tests (C++20 atomic_ref on
// the protocol's plain uint32_t words, which are shared between threads or processes).
#pragma once

#include <atomic>

#include "protocol/protocol.hpp"

namespace ubep::cpu {

static_assert(std::atomic_ref<protocol::Tag>::is_always_lock_free,
              "epoch tags must be lock-free to work across processes");
static_assert(alignof(protocol::Tag) >= std::atomic_ref<protocol::Tag>::required_alignment);

inline void publish_tag(protocol::Tag* tag, uint32_t value) {
  std::atomic_ref<protocol::Tag>(*tag).store(value, std::memory_order_release);
}
inline uint32_t load_tag(const protocol::Tag* tag) {
  // atomic_ref needs a non-const object; the load does not modify it.
  return std::atomic_ref<protocol::Tag>(*const_cast<protocol::Tag*>(tag))
      .load(std::memory_order_acquire);
}
inline bool tag_arrived(const protocol::Tag* tag, uint32_t value) { return load_tag(tag) == value; }

}  // namespace ubep::cpu
