// Freed result blocks kept for the next call that needs one of about the same size (arrays.cpp's
// make_host_block). DeepEP's normal mode returns new tensors of the same sizes call after call
// (recv_x, combined_x: MBs to a hundred MB); a block mapped fresh each time costs its first
// touch, the kernel zeroing every page, which took ~4x the copy itself on the project's VM
// (docs/PERFORMANCE.md, issue 31, twenty-ninth session). A kept block is MADV_FREE'd: the kernel
// may take its pages back under memory pressure (a later write then faults in zeroed pages, as
// a fresh block would); otherwise its pages are reused as they are.
//
// Header-only and free of Python, so tests/test_block_cache.cpp runs it in every build.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <utility>

namespace ubep::python {

class BlockCache {
 public:
  // At most max_blocks blocks and max_bytes bytes kept; a block longer than max_bytes is never
  // kept.
  BlockCache(size_t max_blocks, size_t max_bytes)
      : max_blocks_(max_blocks), max_bytes_(max_bytes) {}
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;
  ~BlockCache() {
    for (auto& [p, len] : kept_) munmap(p, len);
  }

  // A kept block of at least `len` bytes and at most a quarter more (its mapped length in
  // *got), the most recently kept first; nullptr if none.
  void* take(size_t len, size_t* got) {
    std::lock_guard lock(mu_);
    for (auto it = kept_.rbegin(); it != kept_.rend(); ++it) {
      if (it->second < len || it->second > len + len / 4) continue;
      void* p = it->first;
      *got = it->second;
      bytes_ -= it->second;
      kept_.erase(std::next(it).base());
      return p;
    }
    return nullptr;
  }

  // Keeps block p (mmap'd, `len` bytes mapped) for a later take; the oldest kept blocks beyond
  // the bounds are unmapped (and p itself, when longer than max_bytes).
  void give(void* p, size_t len) {
    if (len > max_bytes_ || max_blocks_ == 0) {
      munmap(p, len);
      return;
    }
    madvise(p, len, MADV_FREE);  // outside the lock: the block is this caller's alone still
    std::deque<std::pair<void*, size_t>> evicted;
    {
      std::lock_guard lock(mu_);
      kept_.emplace_back(p, len);
      bytes_ += len;
      while (kept_.size() > max_blocks_ || bytes_ > max_bytes_) {
        evicted.push_back(kept_.front());
        bytes_ -= kept_.front().second;
        kept_.pop_front();
      }
    }
    for (auto& [q, n] : evicted) munmap(q, n);  // outside the lock: taken out of the list
  }

  size_t blocks() const {
    std::lock_guard lock(mu_);
    return kept_.size();
  }
  size_t bytes() const {
    std::lock_guard lock(mu_);
    return bytes_;
  }

 private:
  // Why this is safe: any thread may free a tensor (so give) or make a result (so take). The
  // list and its byte count change only under mu_; a block is in the list or with exactly one
  // owner (the caller that took it, or the capsule that gives it back), never both, since take
  // removes it under the same lock that give adds it under. The system calls on a block run
  // outside the lock, by the block's one owner.
  const size_t max_blocks_, max_bytes_;
  mutable std::mutex mu_;
  std::deque<std::pair<void*, size_t>> kept_;  // oldest first
  size_t bytes_ = 0;
};

}  // namespace ubep::python
