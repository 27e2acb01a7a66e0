/* Ops for tests/e2e/plugin_ops_test.cc, compiled by the test itself with `cc -shared -fPIC`
 * against spdl/op.h only (no spdld header, no spdld library), as an op written outside the tree.
 *
 *   add           x -> (x + value) mod 256 on every sample (args: {value: 0..255}); deterministic,
 *                 so its output is checked exactly against a job without it.
 *   fail_one_in   fails a sample when seed % n == 0 (args: {n: >= 1}), with a message naming the
 *                 seed; changes nothing otherwise.
 *   seed_stamp    writes the seed's low 8 bytes into the first 8 samples of the first row (for
 *                 checking which seed each sample got).
 *   fill          sets every sample to `value` (args: {value: 0..255}) and fails an image smaller
 *                 than `min_side` on either side (args, default 0): placed before the geometry it
 *                 must see the whole decoded image.
 *
 * -DTEST_ABI_VERSION=N builds the same ops claiming ABI version N (a library spdld must refuse).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spdl/op.h"

#ifndef TEST_ABI_VERSION
#define TEST_ABI_VERSION SPDL_OP_ABI_VERSION
#endif

static int json_int(const char* json, const char* key, long* out) {
  char pattern[64];
  snprintf(pattern, sizeof(pattern), "\"%s\":", key);
  const char* p = strstr(json, pattern);
  if (p == NULL) return 0;
  p += strlen(pattern);
  char* end = NULL;
  const long v = strtol(p, &end, 10);
  if (end == p) return -1;
  *out = v;
  return 1;
}

static void* add_create(const char* args, char* err, size_t err_len) {
  long v = 0;
  if (json_int(args, "value", &v) != 1 || v < 0 || v > 255) {
    snprintf(err, err_len, "add: value must be an integer 0..255 (args %s)", args);
    return NULL;
  }
  long* s = malloc(sizeof(long));
  *s = v;
  return s;
}

static int add_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  (void)seed, (void)err, (void)err_len;
  const uint8_t v = (uint8_t) * (const long*)state;
  for (int32_t y = 0; y < im->height; ++y) {
    uint8_t* row = im->data + y * im->stride;
    for (int64_t i = 0; i < (int64_t)im->width * im->channels; ++i) row[i] = (uint8_t)(row[i] + v);
  }
  return 0;
}

static void* fail_create(const char* args, char* err, size_t err_len) {
  long n = 0;
  if (json_int(args, "n", &n) != 1 || n < 1) {
    snprintf(err, err_len, "fail_one_in: n must be >= 1");
    return NULL;
  }
  long* s = malloc(sizeof(long));
  *s = n;
  return s;
}

static int fail_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  (void)im;
  const long n = *(const long*)state;
  if (seed % (uint64_t)n == 0) {
    snprintf(err, err_len, "fail_one_in: refusing seed %llu", (unsigned long long)seed);
    return 7;
  }
  return 0;
}

static void* stamp_create(const char* args, char* err, size_t err_len) {
  (void)args, (void)err, (void)err_len;
  return malloc(1);
}

static int stamp_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  (void)state, (void)err, (void)err_len;
  if ((int64_t)im->width * im->channels < 8) return 1;
  memcpy(im->data, &seed, 8);
  return 0;
}

typedef struct {
  long value, min_side;
} fill_state;

static void* fill_create(const char* args, char* err, size_t err_len) {
  fill_state* s = malloc(sizeof(fill_state));
  s->value = 0;
  s->min_side = 0;
  if (json_int(args, "value", &s->value) != 1 || s->value < 0 || s->value > 255 ||
      json_int(args, "min_side", &s->min_side) < 0) {
    snprintf(err, err_len, "fill: value must be an integer 0..255");
    free(s);
    return NULL;
  }
  return s;
}

static int fill_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  (void)seed;
  const fill_state* s = state;
  if (im->width < s->min_side || im->height < s->min_side) {
    snprintf(err, err_len, "fill: got a %dx%d image, expected at least %ld on each side", im->width, im->height,
             s->min_side);
    return 1;
  }
  for (int32_t y = 0; y < im->height; ++y)
    memset(im->data + y * im->stride, (int)s->value, (size_t)im->width * im->channels);
  return 0;
}

static const spdl_op kOps[] = {
    {TEST_ABI_VERSION, "add", add_create, add_apply, free},
    {TEST_ABI_VERSION, "fail_one_in", fail_create, fail_apply, free},
    {TEST_ABI_VERSION, "seed_stamp", stamp_create, stamp_apply, free},
    {TEST_ABI_VERSION, "fill", fill_create, fill_apply, free},
};

const spdl_op* spdl_ops(int32_t* count) {
  *count = 4;
  return kOps;
}
