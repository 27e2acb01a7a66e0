/* spdl/op.h: the C ABI of a spdld op, a user image transform compiled into a shared library that
 * spdld loads into its decode stage (job config: `transforms: [..., {op: {library: LIB, name: OP,
 * args: {...}}}, ...]`). Plain C: no C++ types cross it, so an op built with any compiler against
 * this header alone (`cc -shared -fPIC -o libmyops.so myops.c`) loads into any spdld that speaks
 * SPDL_OP_ABI_VERSION.
 *
 * Where an op runs: on the decode stage's worker threads, once per sample, on uint8 row-major HWC
 * pixels. Placed after the geometric transforms (resize, center_crop, random_resized_crop), on the
 * image as they left it: the job's output height x width, 3 channels (R, G, B) or 1 with
 * decode.color: gray; ops and horizontal_flip run in the order the config lists them, then
 * normalize / the conversion to the output dtype and layout. With output uint8 NHWC the op edits
 * the batch row in shared memory in place; otherwise a per-thread scratch image, which the
 * conversion then reads. Placed before every geometric transform, on the whole decoded image
 * (upright, full size, RGB), which the resize and crop then read.
 *
 * Trust: an op is code running inside the daemon, with the daemon's privileges, next to every
 * other user's jobs. spdld loads libraries only by file name from its `plugin_dirs` (daemon
 * config; default none), and refuses a directory or library that is group- or world-writable or
 * not owned by root or spdld's user. Only an administrator installs ops.
 *
 * The contract an op keeps:
 *  - `create` parses args_json (the entry's `args`, as JSON; "{}" when absent) and returns the op's
 *    state, or NULL with a NUL-terminated message in err (at most err_len bytes, terminator
 *    included): the job is then refused with that message and the entry's config line. It runs
 *    once per job (on a job-submission thread).
 *  - `apply` may run on many threads at once with the same state: treat the state as read-only
 *    after create (or lock inside). It changes image->data in place, keeping the size; it must
 *    not keep the pointer after it returns. 0 = ok; any other value fails that sample with the
 *    message in err (the job's on_error then skips it or fails the job, as for a corrupt file).
 *    `seed` is a pure function of (sampler.seed, epoch, sample index, the op's place in the chain):
 *    draw every random choice from it and a rerun or a resumed job gets the same pixels.
 *  - `destroy` frees the state, when the job ends (on any thread). NULL = nothing to free.
 *  - Nothing may throw across this ABI (spdld catches a C++ exception that does, fails the call
 *    and logs it, but an op must not rely on that); a crash in an op is a crash of spdld.
 *  - abi_version stays the first field of spdl_op in every version: spdld reads it first and
 *    refuses a library whose ops were built for another version, naming the file.
 *
 * A library exports one function, spdl_ops, returning its ops (a static array, alive until the
 * process exits; names unique within the library). spdld calls it once, when the library is first
 * used, and never unloads a library.
 */
#ifndef SPDL_OP_H_
#define SPDL_OP_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* clang-format off */
#define SPDL_OP_ABI_VERSION 1

/* One image: row-major HWC, uint8. data points at height rows of stride bytes each; a row holds
 * width * channels samples (channels: 3 = R, G, B; 1 = gray). */
typedef struct {
  uint8_t* data;              /* row-major HWC, uint8 */
  int32_t height, width, channels;
  int64_t stride;             /* bytes per row */
} spdl_image;

typedef struct {
  uint32_t abi_version;       /* SPDL_OP_ABI_VERSION */
  const char* name;           /* unique within the library */
  /* args_json: the op's `args` from the job config as JSON. NULL on error (message in err). */
  void* (*create)(const char* args_json, char* err, size_t err_len);
  /* In place, same size. seed: per sample, from (sampler.seed, epoch, sample index). 0 = ok. */
  int (*apply)(void* state, spdl_image* image, uint64_t seed, char* err, size_t err_len);
  void (*destroy)(void* state);
} spdl_op;

/* Exported by the library: its ops. */
const spdl_op* spdl_ops(int32_t* count);
/* clang-format on */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SPDL_OP_H_ */
