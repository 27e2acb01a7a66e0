/* Example spdld ops (include/spdl/op.h), in plain C:
 *
 *   posterize      keep the top `bits` bits of every sample (args: {bits: 1..8}, default 4),
 *                  as PIL's ImageOps.posterize. Deterministic.
 *   gaussian_blur  a Gaussian blur with a random sigma per sample, drawn uniformly from
 *                  [sigma_min, sigma_max] (args, default 0.1 .. 2.0; torchvision GaussianBlur's
 *                  defaults) from the sample's seed: a rerun or a resumed job blurs each sample
 *                  the same way. Separable, edges clamped; kernel radius ceil(3 sigma), at most 16.
 *
 * Built by CMake as libspdl_example_ops.so; by hand: cc -O2 -shared -fPIC -I<prefix>/include
 * -o libspdl_example_ops.so example_ops.c -lm. Install it (owned by root, not group/world-writable)
 * into a directory of the daemon's plugin_dirs, then in a job config:
 *
 *   transforms:
 *     - random_resized_crop: {size: 224}
 *     - op: {library: libspdl_example_ops.so, name: gaussian_blur, args: {sigma_max: 1.5}}
 *     - op: {library: libspdl_example_ops.so, name: posterize, args: {bits: 5}}
 *
 * The args arrive as JSON text with sorted keys and no spaces ({"bits":5}); these ops read flat
 * numeric keys with a few lines of C (a real op would use a JSON library). Their state is
 * read-only after create, so apply is safe on many threads at once, as the ABI requires.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spdl/op.h"

/* The number under "key" in a flat JSON object; 1 when found, 0 when absent, -1 when not a number. */
static int json_number(const char* json, const char* key, double* out) {
  char pattern[64];
  snprintf(pattern, sizeof(pattern), "\"%s\":", key);
  const char* p = strstr(json, pattern);
  if (p == NULL) return 0;
  p += strlen(pattern);
  char* end = NULL;
  const double v = strtod(p, &end);
  if (end == p) return -1;
  *out = v;
  return 1;
}

/* ---- posterize ---- */

typedef struct {
  uint8_t mask;
} posterize_state;

static void* posterize_create(const char* args, char* err, size_t err_len) {
  double bits = 4;
  if (json_number(args, "bits", &bits) < 0 || bits < 1 || bits > 8 || bits != floor(bits)) {
    snprintf(err, err_len, "posterize: bits must be an integer 1..8");
    return NULL;
  }
  posterize_state* s = malloc(sizeof(*s));
  if (s == NULL) {
    snprintf(err, err_len, "posterize: out of memory");
    return NULL;
  }
  s->mask = (uint8_t)(0xFFu << (8 - (int)bits));
  return s;
}

static int posterize_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  (void)seed;
  (void)err;
  (void)err_len;
  const uint8_t mask = ((const posterize_state*)state)->mask;
  const int64_t n = (int64_t)im->width * im->channels;
  for (int32_t y = 0; y < im->height; ++y) {
    uint8_t* row = im->data + y * im->stride;
    for (int64_t i = 0; i < n; ++i) row[i] &= mask;
  }
  return 0;
}

/* ---- gaussian_blur ---- */

enum { kMaxRadius = 16 };

typedef struct {
  double sigma_min, sigma_max;
} blur_state;

static void* blur_create(const char* args, char* err, size_t err_len) {
  double lo = 0.1, hi = 2.0;
  if (json_number(args, "sigma_min", &lo) < 0 || json_number(args, "sigma_max", &hi) < 0 || !(lo > 0) || !(lo <= hi) ||
      hi > kMaxRadius / 3.0) {
    snprintf(err, err_len, "gaussian_blur: need 0 < sigma_min <= sigma_max <= %.2f", kMaxRadius / 3.0);
    return NULL;
  }
  blur_state* s = malloc(sizeof(*s));
  if (s == NULL) {
    snprintf(err, err_len, "gaussian_blur: out of memory");
    return NULL;
  }
  s->sigma_min = lo;
  s->sigma_max = hi;
  return s;
}

/* SplitMix64: one draw from the sample's seed. */
static uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

static int blur_apply(void* state, spdl_image* im, uint64_t seed, char* err, size_t err_len) {
  const blur_state* s = state;
  const double u = (double)(splitmix(seed) >> 11) * 0x1.0p-53;
  const double sigma = s->sigma_min + (s->sigma_max - s->sigma_min) * u;
  int radius = (int)ceil(3 * sigma);
  if (radius > kMaxRadius) radius = kMaxRadius;
  double k[2 * kMaxRadius + 1], sum = 0;
  for (int i = -radius; i <= radius; ++i) sum += k[i + radius] = exp(-(double)(i * i) / (2 * sigma * sigma));
  for (int i = 0; i <= 2 * radius; ++i) k[i] /= sum;

  const int w = im->width, h = im->height, c = im->channels;
  float* tmp = malloc(sizeof(float) * (size_t)w * (size_t)h * (size_t)c);
  if (tmp == NULL) {
    snprintf(err, err_len, "gaussian_blur: out of memory for a %dx%d image", w, h);
    return 1;
  }
  for (int y = 0; y < h; ++y) { /* horizontal pass into tmp */
    const uint8_t* row = im->data + y * im->stride;
    for (int x = 0; x < w; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        double acc = 0;
        for (int i = -radius; i <= radius; ++i) {
          int xx = x + i;
          xx = xx < 0 ? 0 : xx >= w ? w - 1 : xx;
          acc += k[i + radius] * row[xx * c + ch];
        }
        tmp[((size_t)y * w + x) * c + ch] = (float)acc;
      }
    }
  }
  for (int y = 0; y < h; ++y) { /* vertical pass back into the image */
    uint8_t* row = im->data + y * im->stride;
    for (int x = 0; x < w; ++x) {
      for (int ch = 0; ch < c; ++ch) {
        double acc = 0;
        for (int i = -radius; i <= radius; ++i) {
          int yy = y + i;
          yy = yy < 0 ? 0 : yy >= h ? h - 1 : yy;
          acc += k[i + radius] * tmp[((size_t)yy * w + x) * c + ch];
        }
        const long v = lround(acc);
        row[x * c + ch] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
  free(tmp);
  return 0;
}

static const spdl_op kOps[] = {
    {SPDL_OP_ABI_VERSION, "posterize", posterize_create, posterize_apply, free},
    {SPDL_OP_ABI_VERSION, "gaussian_blur", blur_create, blur_apply, free},
};

const spdl_op* spdl_ops(int32_t* count) {
  *count = (int32_t)(sizeof(kOps) / sizeof(kOps[0]));
  return kOps;
}
