#include "backend/cuda/local_windows.hpp"

#include <mutex>
#include <unordered_map>
#include <utility>

namespace ubep::cuda_host {

namespace {
// Who writes: share_local_window inserts (the owner, in its constructor, before the set-up
// allgather that tells peers the address); the last reference's deleter erases. Who reads:
// peers in find_local_window, during set-up, while the owner is still in its constructor (it
// waits at the set-up barrier), so the entry is live. The mutex orders all three. The deleter
// erases before it releases the memory, so an allocation that reuses the address can only be
// published after the old entry is gone, and a lookup never revives a released window
// (weak_ptr::lock on an expired entry gives null).
struct Registry {
  std::mutex mutex;
  std::unordered_map<const char*, std::weak_ptr<char>> windows;
};
Registry& registry() {
  static auto* r = new Registry();  // never destroyed: a Buffer may go during static destruction
  return *r;
}
}  // namespace

std::shared_ptr<char> share_local_window(char* window, std::function<void(char*)> release) {
  std::shared_ptr<char> owner(window, [release = std::move(release)](char* p) {
    {
      Registry& reg = registry();
      std::lock_guard<std::mutex> lock(reg.mutex);
      auto it = reg.windows.find(p);
      if (it != reg.windows.end() && it->second.expired()) reg.windows.erase(it);
    }
    release(p);
  });
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  reg.windows[window] = owner;
  return owner;
}

std::shared_ptr<char> find_local_window(const char* address) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.windows.find(address);
  return it == reg.windows.end() ? nullptr : it->second.lock();
}

}  // namespace ubep::cuda_host
