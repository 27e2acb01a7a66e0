#include "cuda/nvjpeg_backend.h"

#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvjpeg.h>

#include <utility>

#include "cuda/device_scope.h"

namespace spdl::cuda {

static_assert(NVJPEG_STATUS_BAD_JPEG == static_cast<int>(NvjpegStatus::kBadJpeg));
static_assert(NVJPEG_STATUS_JPEG_NOT_SUPPORTED == static_cast<int>(NvjpegStatus::kJpegNotSupported));
static_assert(NVJPEG_STATUS_INCOMPLETE_BITSTREAM == static_cast<int>(NvjpegStatus::kIncompleteBitstream));
static_assert(NVJPEG_VER_MAJOR == 13, "spdld loads libnvjpeg.so.13");

// The nvJPEG entry points spdld uses, resolved with dlsym.
struct NvjpegBackend::Api {
  void* lib = nullptr;
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegDestroy) destroy = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStateDestroy) state_destroy = nullptr;
  decltype(&nvjpegGetImageInfo) get_image_info = nullptr;
  decltype(&nvjpegDecode) decode = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;

  nvjpegHandle_t general = nullptr;  // default backend: single images, headers
  nvjpegJpegState_t general_state = nullptr;
  nvjpegHandle_t batch = nullptr;  // hardware backend when there is one, else = general
  nvjpegJpegState_t batch_state = nullptr;
  bool hardware = false;

  ~Api() {
    if (batch_state != nullptr && batch_state != general_state) state_destroy(batch_state);
    if (batch != nullptr && batch != general) destroy(batch);
    if (general_state != nullptr) state_destroy(general_state);
    if (general != nullptr) destroy(general);
    // The library stays loaded: nvJPEG may keep threads or callbacks registered with the driver.
  }
};

namespace {

struct CudaRuntime {
  Status GetDevice(int* device) {
    return cudaGetDevice(device) == cudaSuccess ? Status::Ok() : Internal("cudaGetDevice failed");
  }
  Status SetDevice(int device) {
    return cudaSetDevice(device) == cudaSuccess ? Status::Ok() : Internal("cudaSetDevice failed");
  }
};

template <typename F>
bool Resolve(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(::dlsym(lib, name));
  return *out != nullptr;
}

}  // namespace

Result<std::unique_ptr<NvjpegBackend>> NvjpegBackend::Create(Options options) {
  auto api = std::make_unique<Api>();
  std::string tried = kNvjpegLibrary;
  api->lib = ::dlopen(kNvjpegLibrary, RTLD_NOW | RTLD_LOCAL);
  std::vector<std::string> dirs = options.library_dirs;
#ifdef SPDL_NVJPEG_LIB_DIR
  dirs.push_back(SPDL_NVJPEG_LIB_DIR);  // where the build found nvJPEG (install-deps.sh's wheel)
#endif
  for (const std::string& dir : dirs) {
    if (api->lib != nullptr) break;
    const std::string path = dir + "/" + kNvjpegLibrary;
    tried += ", " + path;
    api->lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (api->lib == nullptr) {
    return Unavailable(std::string("decode.device: cuda needs nvJPEG (") + kNvjpegLibrary +
                       ", NVIDIA's nvidia-nvjpeg 13.x); not found (tried " + tried + ")");
  }
  bool ok = Resolve(api->lib, "nvjpegCreateEx", &api->create_ex) && Resolve(api->lib, "nvjpegDestroy", &api->destroy) &&
            Resolve(api->lib, "nvjpegJpegStateCreate", &api->state_create) &&
            Resolve(api->lib, "nvjpegJpegStateDestroy", &api->state_destroy) &&
            Resolve(api->lib, "nvjpegGetImageInfo", &api->get_image_info) &&
            Resolve(api->lib, "nvjpegDecode", &api->decode) &&
            Resolve(api->lib, "nvjpegDecodeBatchedInitialize", &api->batched_initialize) &&
            Resolve(api->lib, "nvjpegDecodeBatched", &api->decode_batched);
  if (!ok) return Unavailable(std::string(kNvjpegLibrary) + " lacks an nvJPEG entry point spdld uses: " + ::dlerror());

  CudaRuntime rt;
  ScopedDevice<CudaRuntime> scope(rt, options.device);
  SPDL_RETURN_IF_ERROR(scope.status());
  SPDL_RETURN_IF_ERROR(
      NvjpegError(api->create_ex(NVJPEG_BACKEND_DEFAULT, nullptr, nullptr, 0, &api->general), "nvjpegCreateEx"));
  SPDL_RETURN_IF_ERROR(NvjpegError(api->state_create(api->general, &api->general_state), "nvjpegJpegStateCreate"));
  api->batch = api->general;
  api->batch_state = api->general_state;
  if (options.hardware) {
    nvjpegHandle_t hw = nullptr;
    // NVJPEG_STATUS_ARCH_MISMATCH / NOT_SUPPORTED: no hardware decoder on this GPU.
    if (api->create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, 0, &hw) == NVJPEG_STATUS_SUCCESS) {
      nvjpegJpegState_t st = nullptr;
      if (api->state_create(hw, &st) == NVJPEG_STATUS_SUCCESS) {
        api->batch = hw;
        api->batch_state = st;
        api->hardware = true;
      } else {
        api->destroy(hw);
      }
    }
  }
  auto b = std::unique_ptr<NvjpegBackend>(new NvjpegBackend(std::move(options)));
  b->api_ = std::move(api);
  return b;
}

NvjpegBackend::NvjpegBackend(Options options) : options_(std::move(options)) {}

NvjpegBackend::~NvjpegBackend() = default;

bool NvjpegBackend::hardware() const { return api_->hardware; }

Result<JpegHeader> NvjpegBackend::ReadHeader(std::span<const uint8_t> jpeg) {
  int components = 0;
  nvjpegChromaSubsampling_t css{};
  int widths[NVJPEG_MAX_COMPONENT] = {};
  int heights[NVJPEG_MAX_COMPONENT] = {};
  SPDL_RETURN_IF_ERROR(
      NvjpegError(api_->get_image_info(api_->general, jpeg.data(), jpeg.size(), &components, &css, widths, heights),
                  "nvjpegGetImageInfo"));
  JpegHeader h;
  h.width = widths[0];
  h.height = heights[0];
  h.components = components;
  return h;
}

Status NvjpegBackend::DecodeBatch(std::span<const std::span<const uint8_t>> jpegs, std::span<const DeviceImage> out,
                                  Stream stream) {
  if (jpegs.size() != out.size() || jpegs.empty()) return InvalidArgument("nvjpegDecodeBatched: bad batch");
  std::vector<const unsigned char*> data(jpegs.size());
  std::vector<size_t> lengths(jpegs.size());
  std::vector<nvjpegImage_t> dst(jpegs.size());
  for (size_t i = 0; i < jpegs.size(); ++i) {
    data[i] = jpegs[i].data();
    lengths[i] = jpegs[i].size();
    dst[i] = nvjpegImage_t{};
    dst[i].channel[0] = out[i].data;
    dst[i].pitch[0] = out[i].pitch;
  }
  std::lock_guard lock(mu_);
  CudaRuntime rt;
  ScopedDevice<CudaRuntime> scope(rt, options_.device);
  SPDL_RETURN_IF_ERROR(scope.status());
  const int n = static_cast<int>(jpegs.size());
  if (batch_initialized_ != n) {
    SPDL_RETURN_IF_ERROR(NvjpegError(api_->batched_initialize(api_->batch, api_->batch_state, n, 1, NVJPEG_OUTPUT_RGBI),
                                     "nvjpegDecodeBatchedInitialize"));
    batch_initialized_ = n;
  }
  return NvjpegError(api_->decode_batched(api_->batch, api_->batch_state, data.data(), lengths.data(), dst.data(),
                                          static_cast<cudaStream_t>(stream.handle)),
                     "nvjpegDecodeBatched");
}

Status NvjpegBackend::DecodeOne(std::span<const uint8_t> jpeg, const DeviceImage& out, Stream stream) {
  nvjpegImage_t dst{};
  dst.channel[0] = out.data;
  dst.pitch[0] = out.pitch;
  std::lock_guard lock(mu_);
  CudaRuntime rt;
  ScopedDevice<CudaRuntime> scope(rt, options_.device);
  SPDL_RETURN_IF_ERROR(scope.status());
  return NvjpegError(api_->decode(api_->general, api_->general_state, jpeg.data(), jpeg.size(), NVJPEG_OUTPUT_RGBI,
                                  &dst, static_cast<cudaStream_t>(stream.handle)),
                     "nvjpegDecode");
}

}  // namespace spdl::cuda
