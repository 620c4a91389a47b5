// Epoch tags on the CPU: a release store publishes, an acquire load tests (C++20 atomic_ref on
// the protocol's plain uint32_t words, which are shared between threads or processes).
#pragma once

#include <atomic>

#include "ep/protocol.hpp"

namespace ubep::cpu {

static_assert(std::atomic_ref<ep::Tag>::is_always_lock_free,
              "epoch tags must be lock-free to work across processes");
static_assert(alignof(ep::Tag) >= std::atomic_ref<ep::Tag>::required_alignment);

inline void publish_tag(ep::Tag* tag, uint32_t value) {
  std::atomic_ref<ep::Tag>(*tag).store(value, std::memory_order_release);
}
inline bool tag_arrived(const ep::Tag* tag, uint32_t value) {
  // atomic_ref needs a non-const object; the load does not modify it.
  return std::atomic_ref<ep::Tag>(*const_cast<ep::Tag*>(tag)).load(std::memory_order_acquire) ==
         value;
}

}  // namespace ubep::cpu
