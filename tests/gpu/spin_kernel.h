// SpdlLaunchSpin: enqueues a one-thread kernel on `stream` that spins for about `milliseconds`.
#pragma once

#include <cuda_runtime_api.h>

cudaError_t SpdlLaunchSpin(double milliseconds, cudaStream_t stream);
