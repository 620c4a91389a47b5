// Device windows shared by the ranks of one process (thread ranks on one GPU or on several).
//
// A rank's window is freed when the last rank of this process that mapped it lets go, not when
// its owner's Buffer goes. So thread ranks need no collective at tear-down, and a Buffer may be
// destroyed on any thread at any time. Python frees Buffers whenever its garbage collector runs:
// for thread ranks that is one Buffer after another on one thread, after the rank threads have
// ended, where a tear-down barrier could never complete. Peers in other processes reach a window
// through a CUDA IPC handle and still meet at a barrier before it is freed (KernelEngine).
#pragma once

#include <functional>
#include <memory>

namespace ubep::cuda_host {

// Publishes this rank's `window` to the ranks of this process. The window is released (with
// `release`, on whichever thread drops the last reference) once the returned owner and every
// reference find_local_window handed out are gone.
std::shared_ptr<char> share_local_window(char* window, std::function<void(char*)> release);

// A reference to the window at `address` that a live rank of this process published; null when
// none is published there.
std::shared_ptr<char> find_local_window(const char* address);

}  // namespace ubep::cuda_host
