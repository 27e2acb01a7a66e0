// ScopedDevice: makes a backend's device current on the calling thread for one call, and gives the
// thread its previous device back when the call ends.
//
// The current device (cudaSetDevice) is per-thread state that every library on the thread shares:
// the trainer's Python thread, PyTorch's autograd threads, a DLPack deleter's thread. A backend
// call that switches it and leaves it switched makes the trainer's next kernel run on another GPU.
// So every CudaBackend call runs under a ScopedDevice: it switches only when the thread is on
// another device, and switches back at the end (also on every error path).
//
// `Runtime` is what reads and sets the thread's device: `Status GetDevice(int*)` and
// `Status SetDevice(int)` (CudaBackend: cudaGetDevice / cudaSetDevice; tests: a per-thread fake).
// Thread safety: one scope per call, on the calling thread; not movable.
#pragma once

#include "common/status.h"

namespace spdl::cuda {

template <typename Runtime>
class ScopedDevice {
 public:
  // Makes `device` current on this thread (if it is not already); status() says whether it is.
  ScopedDevice(Runtime& runtime, int device) : runtime_(runtime) {
    int previous = 0;
    status_ = runtime_.GetDevice(&previous);
    if (!status_.ok() || previous == device) return;
    status_ = runtime_.SetDevice(device);
    if (status_.ok()) {
      restore_ = true;
      previous_ = previous;
    }
  }
  // Gives the thread its previous device back (a failure there is ignored: the call is done).
  ~ScopedDevice() {
    if (restore_) (void)runtime_.SetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  const Status& status() const { return status_; }

 private:
  Runtime& runtime_;
  Status status_;
  bool restore_ = false;
  int previous_ = 0;
};

}  // namespace spdl::cuda
