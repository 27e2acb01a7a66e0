// The region every job with slots of row tensors starts with (MediaJob, StreamJob): the shared
// region with its header written, and the JobAccepted fields that describe its slots and tensors.
// One place, so the two kinds of job cannot drift apart in what the client maps.
//
// Plain functions of their arguments: safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"
#include "jobs/sample_decoder.h"
#include "proto/control.pb.h"
#include "proto/shm_layout.h"
#include "shm/shared_region.h"

namespace spdl::jobs {

// The job's shared region ("spdld-job-<job_id>", layout.region_bytes), its header written; only
// the first `reserve_bytes` are reserved up front (SharedRegion::Create). Errors: Create's.
Result<shm::SharedRegion> CreateJobRegion(uint64_t job_id, const proto::SlotLayout& layout,
                                          size_t reserve_bytes = SIZE_MAX);

// Sets `accepted`'s slot fields from `layout` (and batch_size) and adds one tensor per `tensors`
// entry, shaped [batch, row_shape...] at the layout's offsets.
// REQUIRES: tensors.size() == layout.tensor_offsets.size(); accepted != nullptr.
void DescribeSlots(const proto::SlotLayout& layout, const std::vector<RowTensor>& tensors, uint32_t batch,
                   proto::JobAccepted* accepted);

}  // namespace spdl::jobs
