// spdl-gpu-consumer: the trainer's side of the [gpu] end-to-end test, in its own process (CUDA IPC
// handles cannot be opened in the process that exported them).
//
//   spdl-gpu-consumer REGION_FD REGION_BYTES SLOTS_OFFSET SLOT_STRIDE NUM_SLOTS
//
// It maps the job's shared region from the inherited REGION_FD, then speaks a line protocol:
//   stdin  "H <hex CudaHandles>"        once: opens the device slots (DeviceSlotView + CudaBackend)
//   stdout "C <hex CudaConsumerEvents>" the answer
//   stdin  "B <slot> <gen> <seq> <slow>" per batch
//   stdout "R <slot> <gen> <seq>"       after releasing it
//   stdin  "Q"                          quit
//   stdout "D <batches checked>"        last line, after the view is closed
//   stdout "E <message>"                any failure (then exit 1)
// For each batch it makes its stream wait on the slot's ready event (no host sync), then:
//   slow = 0: copies the device slot back and checks it byte for byte against the host slot (which
//             the daemon does not touch while the batch is leased) and against Pattern(seq);
//   slow = 1: enqueues a ~30 ms kernel and then a device-to-device snapshot of the slot, releases
//             the batch AT ONCE (before that work has run), and only then checks the snapshot
//             against Pattern(seq). The daemon refills the slot as soon as it is released, so the
//             snapshot is right only if the daemon's copy waited for our consumer-done event.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_handles.h"
#include "cuda/ipc_messages.h"
#include "gpu_util.h"
#include "proto/control.pb.h"
#include "shm/shared_region.h"
#include "spdl/cuda/cuda_device.h"
#include "spdl/cuda/device_slot_view.h"
#include "spin_kernel.h"

namespace spdl::gpu_test {
namespace {

// Thrown by Fail, after its line: main returns 1 (std::exit would run the exit handlers while the CUDA
// runtime's threads run).
struct Failed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Fail(const std::string& message) {
  std::cout << "E " << message << '\n' << std::flush;
  throw Failed(message);
}

void Check(const Status& s, const std::string& what) {
  if (!s.ok()) Fail(what + ": " + s.ToString());
}

// The first byte where `got` differs from the slot of batch `seq` (and, if given, from `host`).
std::string Compare(const std::vector<uint8_t>& got, uint64_t seq, const uint8_t* host) {
  for (size_t j = 0; j < got.size(); ++j) {
    if (got[j] != Pattern(seq, j) || (host && got[j] != host[j])) {
      std::ostringstream os;
      os << "batch " << seq << ": byte " << j << " is " << int{got[j]} << ", expected " << int{Pattern(seq, j)}
         << (host ? " (host slot " + std::to_string(host[j]) + ")" : "");
      return os.str();
    }
  }
  return "";
}

int Main(int argc, char** argv) {
  if (argc != 6) Fail("usage: spdl-gpu-consumer REGION_FD REGION_BYTES SLOTS_OFFSET SLOT_STRIDE NUM_SLOTS");
  const int fd = ArgInt(argv[1]);
  const uint64_t region_bytes = std::strtoull(argv[2], nullptr, 10);
  const uint64_t slots_offset = std::strtoull(argv[3], nullptr, 10);
  const uint64_t slot_stride = std::strtoull(argv[4], nullptr, 10);
  const auto num_slots = static_cast<uint32_t>(std::strtoul(argv[5], nullptr, 10));
  auto region = shm::SharedRegion::Map(UniqueFd(fd), region_bytes);
  if (!region.ok()) Fail("mapping the region: " + region.status().ToString());

  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("H ", 0) != 0) Fail("expected H");
  std::string bytes;
  proto::CudaHandles msg;
  if (!FromHex(line.substr(2), &bytes) || !msg.ParseFromString(bytes)) Fail("bad CudaHandles");
  auto handles = cuda::ParseCudaHandles(msg, num_slots, slot_stride);
  Check(handles.status(), "CudaHandles");

  auto backend = client::OpenDaemonDevice(*handles);
  Check(backend.status(), "opening the daemon's device");
  cuda::DeviceBackend& b = **backend;
  // Declared in teardown order's reverse: the view goes first, then the snapshot, then the stream.
  auto stream = cuda::MakeStream(b);
  Check(stream.status(), "stream");
  auto snapshot = cuda::AllocDevice(b, slot_stride);
  Check(snapshot.status(), "snapshot buffer");
  auto view = client::DeviceSlotView::Open(b, *handles, stream->get());
  Check(view.status(), "DeviceSlotView::Open");

  proto::CudaConsumerEvents reply;
  cuda::BuildCudaConsumerEvents((*view)->consumer_done_handles(), &reply);
  std::cout << "C " << ToHex(reply.SerializeAsString()) << '\n' << std::flush;

  std::vector<uint8_t> back(slot_stride);
  uint64_t checked = 0;
  const auto cs = static_cast<cudaStream_t>(stream->get().handle);
  while (std::getline(std::cin, line)) {
    if (line == "Q") break;
    std::istringstream in(line);
    char tag = 0;
    uint32_t slot = 0;
    uint64_t gen = 0, seq = 0;
    int slow = 0;
    if (!(in >> tag >> slot >> gen >> seq >> slow) || tag != 'B') Fail("bad line: " + line);
    auto data = (*view)->Acquire(slot, gen);
    Check(data.status(), "Acquire");
    const uint8_t* host = region->data() + slots_offset + uint64_t{slot} * slot_stride;
    if (!slow) {
      Check(b.MemcpyD2HAsync(back.data(), *data, slot_stride, stream->get()), "copy back");
      Check(b.SynchronizeStream(stream->get()), "sync");
      const std::string bad = Compare(back, seq, host);
      if (!bad.empty()) Fail(bad);
      Check((*view)->Release(slot, gen), "Release");
      std::cout << "R " << slot << " " << gen << " " << seq << '\n' << std::flush;
    } else {
      if (cudaError_t e = SpdlLaunchSpin(30.0, cs); e != cudaSuccess) Fail(cudaGetErrorString(e));
      if (cudaError_t e = cudaMemcpyAsync(snapshot->get().ptr, *data, slot_stride, cudaMemcpyDeviceToDevice, cs);
          e != cudaSuccess) {
        Fail(std::string("snapshot: ") + cudaGetErrorString(e));
      }
      Check((*view)->Release(slot, gen), "Release");
      std::cout << "R " << slot << " " << gen << " " << seq << '\n' << std::flush;  // before the work ran
      Check(b.MemcpyD2HAsync(back.data(), snapshot->get().ptr, slot_stride, stream->get()), "copy back the snapshot");
      Check(b.SynchronizeStream(stream->get()), "sync");
      const std::string bad = Compare(back, seq, nullptr);
      if (!bad.empty()) Fail("slow consumer's snapshot was overwritten: " + bad);
    }
    ++checked;
  }
  view->reset();  // closes the IPC mapping before the daemon frees the memory
  std::cout << "D " << checked << '\n' << std::flush;
  return 0;
}

}  // namespace
}  // namespace spdl::gpu_test

int main(int argc, char** argv) try {
  return spdl::gpu_test::Main(argc, argv);
} catch (const std::exception& e) {  // Fail's (its "E" line is out), or a library's: status 1
  if (dynamic_cast<const spdl::gpu_test::Failed*>(&e) == nullptr) std::cout << "E " << e.what() << '\n' << std::flush;
  return 1;
}
