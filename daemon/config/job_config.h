// JobConfig: what a training job asks spdld for — where the samples are, in what order, how they
// are transformed and batched, and what the batches look like. Parsed from the job's YAML
// (see config/examples/imagenet.yaml for every key, commented).
//
// Plain values with defaults; safe to copy and hand between threads. ParseJobConfig is a pure
// function (no I/O, no global state) and may be called from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/augment_spec.h"
#include "config/config_error.h"
#include "config/override.h"

namespace spdl::config {

// The resampling filter of a resize (torchvision's InterpolationMode on PIL images). YAML: bilinear |
// bicubic | area (or box: PIL's BOX on the exact path, swscale's area average on the fast one) |
// nearest | hamming (exact path only) | lanczos. Video frames take bilinear | bicubic | area | nearest |
// lanczos (always swscale).
enum class Interpolation { kBilinear, kBicubic, kArea, kNearest, kHamming, kLanczos };

// How images are decoded and resampled (YAML decode.resample).
enum class Resample {
  kExact,  // exact: the pixels of PIL + torchvision (full-size decode, PIL's filters); the default
  kFast,   // fast: DCT-scaled decode to Y/Cb/Cr planes + one swscale pass (close to PIL's, not equal)
};

// Resize, either keeping the aspect ratio (shorter side -> `shorter`) or to a fixed height x width.
// Exactly one of: shorter > 0, or height > 0 && width > 0 (the parser guarantees it).
struct ResizeOp {
  int shorter = 0;  // target length of the shorter side (aspect ratio kept); 0 = not used
  int height = 0;   // fixed output height; 0 = not used
  int width = 0;    // fixed output width; 0 = not used
  Interpolation interpolation = Interpolation::kBilinear;  // see Interpolation
  // With `shorter`: torchvision's max_size (> shorter): a longer side that would exceed it becomes
  // max_size, the shorter int(max_size * shorter / longer). 0 = none. (YAML antialias: true is
  // accepted and is what PIL always does; false is refused.)
  int max_size = 0;

  bool operator==(const ResizeOp&) const = default;
};

// Crop a height x width window from the center of the image.
struct CenterCropOp {
  int height = 0;  // window height, 1..16384
  int width = 0;   // window width, 1..16384

  bool operator==(const CenterCropOp&) const = default;
};

// torchvision RandomResizedCrop: a random rectangle of the image (area fraction drawn uniformly from
// `scale`, aspect ratio w/h log-uniformly from `ratio`; ten attempts, then the central fallback)
// resized to height x width. Replaces resize and center_crop (it cannot be combined with them).
// Its draws come from (sampler.seed, epoch, sample index), so a rerun gives the same crops.
struct RandomResizedCropOp {
  int height = 0;           // output height, 1..16384 (YAML: size: S or [H, W])
  int width = 0;            // output width, 1..16384
  double scale_min = 0.08;  // YAML: scale: [min, max], 0 < min <= max <= 1
  double scale_max = 1.0;
  double ratio_min = 3.0 / 4.0;  // YAML: ratio: [min, max], 0 < min <= max
  double ratio_max = 4.0 / 3.0;
  Interpolation interpolation = Interpolation::kBilinear;  // see Interpolation

  bool operator==(const RandomResizedCropOp&) const = default;
};

// torchvision RandomHorizontalFlip: mirror the output left-right with probability p. Must come
// after the geometric transforms (resize, center_crop, random_resized_crop).
struct HorizontalFlipOp {
  double p = 0.5;  // probability, 0..1

  bool operator==(const HorizontalFlipOp&) const = default;
};

// torchvision ToTensor + Normalize: the output is (x / max - mean[c]) / stddev[c] per channel (R, G,
// B; or the one gray channel), max being 255 for 8-bit sources and 65535 for 16-bit ones. Needs a
// floating-point output.dtype; must come after the geometric transforms (the padding of a center
// crop larger than the image is normalized too, as zeros would be in torchvision).
// YAML: three values each for decode.color: rgb, one each (a number or a list of one) for gray;
// a gray job's one value is stored in all three entries.
struct NormalizeOp {
  std::array<double, 3> mean = {0, 0, 0};    // in units of the [0, 1] range, e.g. 0.485
  std::array<double, 3> stddev = {1, 1, 1};  // YAML: std; > 0, e.g. 0.229

  bool operator==(const NormalizeOp&) const = default;
};

// A user op (include/spdl/op.h) from a library in the daemon's plugin_dirs, run in the decode stage
// on uint8 HWC pixels. YAML: op: {library: NAME, name: OP, args: {...}}. Before normalize, and
// either after every geometric transform (on the output-size image; ops and horizontal_flip run in
// the order written) or before every one (on the whole decoded image, upright; rgb only). At most 16 per job. The
// library and op are looked up, and `create` runs, when the job is submitted (jobs/sample_decoder.h); they are not
// checked here.
struct UserOp {
  std::string library;           // a file name (no '/') in the daemon's plugin_dirs, e.g. libmyops.so
  std::string name;              // the op's name within the library
  std::string args_json = "{}";  // YAML `args` (a map; default {}) as JSON: objects with sorted keys, so
                                 // equal args give equal text (part of the resume fingerprint)
  // Where the entry is written (for messages): "transforms.N.op" and its 1-based line (0 when set
  // by --set). Not part of the op's identity: operator== and the resume fingerprint ignore them.
  std::string path;
  int line = 0;

  bool operator==(const UserOp& o) const { return library == o.library && name == o.name && args_json == o.args_json; }
};

// ---- built-in augmentations (README "Augmentations"; media/augment.h has the pixels) ----
// One of: color_jitter, grayscale, gaussian_blur, posterize, solarize, equalize, autocontrast,
// sharpness, invert, rand_augment, trivial_augment_wide, auto_augment, vertical_flip, rotate,
// affine, as torchvision's transform of that name. Run in the decode stage on the uint8 image, after
// every geometric transform (resize, center_crop, random_resized_crop), in the order written among
// themselves, horizontal_flip and ops, and before normalize. Random parameters come from
// (sampler.seed, epoch, sample index) and the op's place in the chain.
struct AugmentOp {
  AugmentSpec spec;  // the parser guarantees media::ValidateAugment(spec) passes

  bool operator==(const AugmentOp&) const = default;
};

// torchvision RandomErasing: with probability p, a rectangle (area fraction uniform in `scale`,
// aspect ratio log-uniform in `ratio`, ten attempts) of the output tensor set to `value` (per
// channel, in the tensor's units, i.e. after normalize) or to standard normal noise (value: random).
// Must be the last transform.
struct RandomErasingOp {
  double p = 0.5;
  std::array<double, 2> scale = {0.02, 0.33};
  std::array<double, 2> ratio = {0.3, 3.3};
  std::array<double, 3> value = {0, 0, 0};
  bool random = false;  // YAML value: random

  bool operator==(const RandomErasingOp&) const = default;
};

// torchvision RandomCrop: pad the image (padding: p, [left/right, top/bottom] or [left, top, right,
// bottom]; pad_if_needed), then a uniformly placed window of `size`. Comes right after the geometry,
// which must give a fixed size (center_crop, resize {height, width} or random_resized_crop), before
// every other augmentation, flip and op; the output is `size`.
struct RandomCropOp {
  RandomCropSpec spec;

  bool operator==(const RandomCropOp&) const = default;
};

using TransformOp = std::variant<ResizeOp, CenterCropOp, RandomResizedCropOp, HorizontalFlipOp, NormalizeOp, UserOp,
                                 AugmentOp, RandomErasingOp, RandomCropOp>;

// What a job does with a sample that cannot be read or decoded.
enum class OnError {
  kSkip,  // count it, skip it, go on
  kFail,  // fail the job with a message naming the file
};

// How every rank gets the same number of samples when the dataset does not divide evenly.
enum class Uneven {
  kPad,   // repeat samples from the start of the order to fill the last rank
  kDrop,  // drop the tail so that every rank has floor(N / world_size)
};

// Where a job's samples come from. Which keys apply depends on `type` (the parser refuses a key of
// another type, and a missing required one):
//   image_folder  root (required), extensions
//   file_list     list (required), root
//   tar           shards (required), extensions, label_extension, shuffle_buffer
//   http          list (required), base_url, timeout_ms, connect_timeout_ms, max_attempts, max_in_flight
//   coco          annotations (required), root (required), max_boxes, on_overflow, contiguous_ids,
//                 include_crowd, masks, min_box_size, min_visibility (CocoConfig)
// Every local path (root, list, shards) must lie below the daemon's allowed_roots, and every URL
// below its allowed_url_prefixes; that is checked when the job is submitted, not here.
enum class SourceType {
  kImageFolder,  // root/<class>/<file>: sub-folder = class, label = index of the sorted folder name
  kFileList,     // a text/CSV file of "path[,label]" lines; paths relative to `root`
  kTar,          // WebDataset tar shards, read in place; samples grouped by key (x.jpg + x.cls)
  kHttp,         // a file of "url[,label]" lines, or of "path[,label]" lines below `base_url`
  kCoco,         // a COCO instances JSON (`annotations`) and its image folder (`root`): boxes per sample
  kS3Prefix,     // every object below an s3:// prefix; class = first path component after it
  kStream,       // a named node-local stream that producers put samples into (StreamSourceConfig)
  kWatch,        // root/<class>/<file> watched with inotify: each new complete file a sample (WatchSourceConfig)
};

// Object storage settings of a source that names s3:// URLs (tar shards, a file list of s3://
// lines, s3_prefix); YAML: the `s3:` map of the source. The endpoint and region default to the
// ones the client sends with the job (its AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL and AWS_REGION /
// AWS_DEFAULT_REGION), then to AWS (https://s3.<region>.amazonaws.com, us-east-1).
struct S3SourceConfig {
  std::string endpoint_url;            // "" = the client's, else AWS; http:// or https://
  std::string region;                  // "" = the client's, else us-east-1
  std::string addressing = "auto";     // auto | path | virtual (auto: virtual for AWS, path for an endpoint)
  int64_t timeout_ms = 60'000;         // one whole request attempt, 1..3600000
  int64_t connect_timeout_ms = 5'000;  // 1..3600000
  int64_t stall_timeout_ms = 10'000;   // no byte for this long cuts the transfer (then retried); 1000..3600000
  int max_attempts = 5;                // per request, retries with backoff, 1..100
  int64_t initial_backoff_ms = 100;    // 0..60000
  int64_t max_backoff_ms = 5'000;      // initial_backoff_ms..600000
  int max_in_flight = 16;              // requests at once for the job, 1..1024

  bool operator==(const S3SourceConfig&) const = default;
};

// source.type: watch — a folder laid out like image_folder (`root`, `extensions`) watched with
// inotify (io/dir_watcher.h): every new complete file (closed after being written, or renamed into
// place, with no writer left) becomes one sample, once. The files feed a stream (jobs/watch_feeder.h)
// and the job consumes it as a stream job: no epochs, batches as files arrive.
struct WatchSourceConfig {
  bool include_existing = true;      // YAML existing: include | skip — the files there at the start
  std::vector<std::string> classes;  // fixed class folders, label = index (others ignored); empty:
                                     // the folders at the start sorted, later ones in order of arrival
  bool operator==(const WatchSourceConfig&) const = default;
};

// source.type: stream — samples as producers put them into the named node-local stream (issue 21,
// daemon/streams). No epochs: the job runs until the stream is closed, or max_samples were
// delivered. The first producer or stream job naming a stream defines it: a job that defines it
// gives its retention bounds (retain_samples, retain_bytes) and who else may use it (allowed_uids).
struct StreamSourceConfig {
  std::string name;                             // the stream (required): [A-Za-z0-9_.-]{1,128}
  std::string group = "default";                // the consumer group: each sample goes to one job of a group,
                                                // every group sees every sample
  uint64_t max_samples = 0;                     // the job ends after delivering this many; 0 = until closed
  uint64_t retain_samples = 100000;             // when this job defines the stream: its max_samples, >= 1
  uint64_t retain_bytes = uint64_t{256} << 20;  // when this job defines the stream: its max_bytes (a byte
                                                // size like "64MiB"), >= 1
  std::vector<uint32_t> allowed_uids;           // when this job defines the stream: other uids allowed
  bool operator==(const StreamSourceConfig&) const = default;
};

// The YAML name of a source type ("image_folder", "file_list", "tar", "http").
const char* SourceTypeName(SourceType type);

// source.type: coco — a COCO instances JSON and its images. A batch gets, beside `image` and `label`
// (-1: a detection sample has no class), `boxes` float32 [B, max_boxes, 4] (x1, y1, x2, y2 in output
// pixels, moved by every geometric transform with the pixels), `box_labels` int64 [B, max_boxes]
// and `box_count` int32 [B] (rows past it are zero); with masks: true also `mask` uint8 [B, H, W].
struct CocoConfig {
  enum class OnOverflow {
    kError,     // a sample with more than max_boxes boxes (after the geometry) fails, naming it
    kTruncate,  // keep the first max_boxes (in the JSON's order)
  };
  std::string annotations;                      // the instances JSON (required); below allowed_roots
  int64_t max_boxes = 100;                      // boxes per sample row, 1..10000
  OnOverflow on_overflow = OnOverflow::kError;  // YAML: error | truncate
  bool contiguous_ids = false;                  // box_labels: category ids as written (false) or 0..K-1 in id order
  bool include_crowd = false;                   // keep annotations with iscrowd: 1 (their polygon masks too)
  bool masks = false;                           // rasterise the polygons into `mask`: 0 background, else the
                                                // category id (contiguous_ids: its index + 1); later objects on top
  double min_box_size = 1.0;                    // drop a box narrower or lower than this (output pixels), >= 0
  double min_visibility = 0.0;                  // drop a box whose area after clipping is below this fraction of its
                                                // area before clipping, 0..1
  bool operator==(const CocoConfig&) const = default;
};

struct SourceConfig {
  SourceType type = SourceType::kImageFolder;  // YAML: image_folder | file_list | tar | http | coco | s3_prefix
  // image_folder: the data directory (required, non-empty). file_list: the directory relative paths
  // are below ("" = the list file's directory).
  std::string root;
  // image_folder: file name endings to take; tar: member endings taken as the sample's image, in
  // order of preference (default .jpg .jpeg .png .webp). For media: audio the default of both is
  // .wav .flac .mp3 .ogg .opus .m4a; for media: video .mp4 .webm .mkv .mov .avi. Matched
  // case-insensitively, stored lower-case, each starting with '.'.
  // The decoder reads JPEG, PNG, WebP, BMP, TIFF and GIF whatever the name says (by magic bytes);
  // list .png .webp .bmp .tif .tiff .gif here to take those files too.
  std::vector<std::string> extensions = {".jpg", ".jpeg"};
  // file_list, http: the list file (required).
  std::string list;
  // tar: the shard files, each a path or a brace pattern such as /data/train-{000..127}.tar
  // (YAML: one string or a list of them); required, non-empty.
  std::vector<std::string> shards;
  std::string label_extension = ".cls";  // tar: the member ending holding the label; "" = no labels
  int64_t shuffle_buffer = 1000;         // tar: samples in the seeded shuffle buffer, 1..16777216
                                         // (1 = shard order, shuffled shards only)
  std::string base_url;                  // http: "" = the list holds URLs; else paths below this URL
  int64_t timeout_ms = 30'000;           // http: one whole request attempt, 1..3600000
  int64_t connect_timeout_ms = 5'000;    // http: establishing a connection, 1..3600000
  int max_attempts = 4;                  // http: attempts per sample (retries with backoff), 1..100
  int max_in_flight = 16;                // http: requests at once for the job, 1..1024
  CocoConfig coco;                       // coco: the annotations and how boxes are delivered
  // ---- object storage ----
  std::string prefix;         // s3_prefix: "s3://bucket/some/prefix/" (required)
  S3SourceConfig s3;          // tar, file_list, s3_prefix: the `s3:` map
  WatchSourceConfig watch;    // watch: YAML keys existing, classes directly under `source:`
  StreamSourceConfig stream;  // stream (and watch, name optional there): YAML keys name, group, max_samples,
                              // retain_samples, retain_bytes, allowed_uids directly under `source:`

  // True when the source reads object storage: s3_prefix, or tar shards named s3://.
  // (A file_list's s3:// lines are seen only when the list is read.)
  bool UsesS3() const;

  bool operator==(const SourceConfig&) const = default;
};

// One entry of `sources:` (dataset mixing, io/mixed_source.h): a source written as `source:` is,
// plus its weight. YAML: sources: [{type: image_folder, root: /a, weight: 0.7}, {..., weight: 0.3}].
struct WeightedSource {
  SourceConfig source;
  double weight = 1;  // > 0 and <= 1e6, relative to the other entries (YAML weight; default 1)
  int line = 0;       // 1-based line of the entry (0: set by --set); for messages, not part of equality

  bool operator==(const WeightedSource& o) const { return source == o.source && weight == o.weight; }
};

struct SamplerConfig {
  bool shuffle = true;           // shuffle the order each epoch (a pure function of seed and epoch)
  uint64_t seed = 0;             // shuffle seed; the same on every rank of a job
  Uneven uneven = Uneven::kPad;  // YAML: pad | drop
  // With `sources:` (a mix) only: draws per epoch over all ranks, 1..2^40; 0 (the default) = the
  // sum of the sources' sizes (io/mixed_source.h has the epoch semantics).
  uint64_t epoch_samples = 0;

  bool operator==(const SamplerConfig&) const = default;
};

struct BatchConfig {
  int size = 32;           // samples per batch, 1..65536
  bool drop_last = false;  // drop a last, partial batch of an epoch (else it is sent short)

  bool operator==(const BatchConfig&) const = default;
};

// Element type of the image tensor. Floating-point types hold x / 255 (x / 65535 for 16-bit
// sources such as 16-bit PNGs, whose full precision they keep), or the normalize transform's
// values. uint8 holds the 8-bit value (a 16-bit source's high byte).
enum class DType { kUInt8, kFloat32, kFloat16, kBFloat16 };
// Dimension order of the image tensor.
enum class Layout { kNHWC, kNCHW };

struct OutputConfig {
  DType dtype = DType::kUInt8;    // YAML: uint8 | float32 | float16 | bfloat16
  Layout layout = Layout::kNHWC;  // YAML: NHWC | NCHW
  std::string device = "cpu";     // where batches are delivered: "cpu" or "cuda:N" (YAML: cpu | cuda | cuda:N)
  int cuda_device = -1;           // N of cuda:N ("cuda" = 0); -1 for cpu
  // Who copies a cuda batch from the shared host slot to the GPU: the daemon (its own stream, CUDA
  // IPC to the client) or the client (it pins the shared slots in its own process).
  enum class Copy { kDaemon, kClient };
  Copy copy = Copy::kDaemon;  // YAML: daemon | client; only meaningful for a cuda device

  bool operator==(const OutputConfig&) const = default;
};

// What becomes of an image's alpha channel.
enum class AlphaMode {
  kDrop,       // keep the colour as stored, like PIL's convert("RGB")
  kComposite,  // blend over `background` by alpha
};

// The channels of a decoded image.
enum class ColorMode {
  kRgb,   // 3 channels, R G B (a grayscale source is repeated into all three)
  kGray,  // 1 channel: the luma of a colour source (ITU-R 601: 0.299 R + 0.587 G + 0.114 B, as
          // PIL's convert("L")), a grayscale source as it is
};

// Where images are decoded (YAML decode.device).
enum class DecodeDevice {
  kCpu,   // the worker pool (libjpeg-turbo, FFmpeg); the default
  kCuda,  // nvJPEG on the job's GPU (output.device: cuda:N, copy: daemon), straight into its device
          // slots; per-sample CPU fallback for what nvJPEG refuses. JPEG only; the transforms must be
          // resize / center_crop / random_resized_crop / horizontal_flip / normalize, decode.resample
          // exact, color rgb, no exif_orientation (the parser names what is not)
};

// How images are decoded (the format is told by the file's magic bytes: JPEG, PNG, WebP, BMP,
// TIFF, GIF).
struct DecodeConfig {
  DecodeDevice device = DecodeDevice::kCpu;         // YAML: cpu | cuda
  ColorMode color = ColorMode::kRgb;                // YAML: rgb | gray; the image tensor's C is 3 or 1
  bool exif_orientation = false;                    // JPEG: turn the image upright by its EXIF Orientation tag
  AlphaMode alpha = AlphaMode::kDrop;               // YAML: drop | composite
  std::array<int, 3> background = {255, 255, 255};  // RGB 0..255, for alpha: composite
  int64_t max_pixels = 178956970;                   // refuse images with more pixels (PIL's limit), from the header
  Resample resample = Resample::kExact;             // YAML: exact | fast (hamming needs exact)

  bool operator==(const DecodeConfig&) const = default;
};

// The engine settings of one pipeline stage (YAML: stages: {read: {...}, decode: {...}}).
struct StageConfig {
  int concurrency = 0;  // most tasks of this stage running at once for this job, 1..1024;
                        // 0 (the default) = as many as the node's pool runs
  int queue = 0;        // rows that may wait to start in the stage, 1..65536; 0 (the default) =
                        // twice the stage's pool threads at the time, at least 4. A full
                        // queue holds back the stage before. Not for the first stage (read):
                        // the ring feeds it

  bool operator==(const StageConfig&) const = default;
};

struct StagesConfig {
  StageConfig read;    // io stage: reads each sample's bytes (on the daemon's I/O pool)
  StageConfig decode;  // cpu stage: decode + fused transforms into the row (on the worker pool)

  bool operator==(const StagesConfig&) const = default;
};

// In which order ready batches are delivered.
enum class Order {
  kSampler,     // the sampler's order: deterministic, resumable
  kCompletion,  // whichever batch of the current epoch is complete first (a slow sample does not
                // hold back later batches); the epoch's last batch still comes last. Such a job
                // hands out no resume token and cannot be resumed
};

// When skipped samples fail the job anyway. At most one of count / fraction is set (>= 0).
struct MaxFailures {
  int64_t count = -1;    // YAML: an integer, e.g. 100: fail when more samples than this failed
  double fraction = -1;  // YAML: a decimal in [0, 1], e.g. 0.01: fail when more than this
                         // fraction of the samples tried failed

  bool operator==(const MaxFailures&) const = default;
};

// What one sample is, and so which decoder runs and which tensors a batch holds:
//   image  `image` (transforms, output.dtype/layout) + `label`
//   audio  `audio` float32|int16 [B, C, L] (channels first, as torchaudio) + `length` int64 [B]
//          (valid samples per channel; the rest is zero padding) + `label` int64 [B]
//   video  `video` uint8 [B, T, H, W, 3] RGB + `frames` int64 [B] (real frames; the rest repeat
//          the last) + `label` int64 [B]
enum class Media { kImage, kAudio, kVideo };

// The YAML name of a media kind ("image", "audio", "video").
const char* MediaName(Media media);

enum class AudioCrop { kStart, kRandom };
enum class AudioDType { kFloat32, kInt16 };

// media: audio. Any audio FFmpeg reads (WAV, FLAC, MP3, Ogg/Opus, ...), resampled and mixed to
// `channels`, cropped or zero-padded to `length` samples per channel.
struct AudioConfig {
  int sample_rate = 16000;                  // output rate in Hz, 1..768000
  int channels = 1;                         // 1 (mono: downmixed) or 2 (stereo)
  int64_t length = 0;                       // samples per channel, 1..2^31 (YAML: length: N, or seconds: S
                                            // = round(S x sample_rate)); exactly one of the two is required
  AudioCrop crop = AudioCrop::kStart;       // YAML: start | random (uniform within the file, drawn
                                            // from (sampler.seed, epoch, sample index))
  AudioDType dtype = AudioDType::kFloat32;  // YAML: float32 ([-1, 1]) | int16
  double max_seconds = 3 * 3600.0;          // refuse longer files (from the header), > 0

  bool operator==(const AudioConfig&) const = default;
};

// media: video. Any video FFmpeg reads (MP4/H.264, WebM/VP9, ...): `frames` frames at a stride or
// a target fps from a start, each resized to height x width RGB.
struct VideoConfig {
  int frames = 8;             // T, 1..4096
  int stride = 1;             // every stride-th source frame, 1..10000 (YAML: stride or fps, not both)
  double fps = 0;             // > 0: sample at this rate instead of by stride (0 < fps <= 1000)
  bool random_start = false;  // YAML start: random (uniform within the clip, drawn from
                              // (sampler.seed, epoch, sample index)) or a time in seconds >= 0
  double start_seconds = 0;   // when not random_start
  int height = 0;             // output frame size, 1..16384 each (required)
  int width = 0;
  Interpolation interpolation = Interpolation::kBilinear;  // bilinear | bicubic | area | nearest | lanczos

  bool operator==(const VideoConfig&) const = default;
};

// A per-sample output beside the media's own tensors (YAML: extra_outputs: [{name, from, ...}]):
// the raw bytes of a sidecar of each sample — in a tar shard the member of the sample's key with
// that ending (000123.txt beside 000123.jpg), in a folder or a file list the file with the same
// path up to its last '.' and that ending — zero-padded to max_bytes. A batch gets `name` uint8
// [B, max_bytes] and `<name>_length` int32 [B] (the bytes that are the sidecar's). Any media kind;
// not with source.type http.
struct ExtraOutputConfig {
  enum class OnMissing {
    kError,  // the sample fails (then on_error says whether it is skipped or fails the job)
    kEmpty,  // length 0, an all-zero row
  };
  enum class OnOverflow {
    kError,     // a sidecar longer than max_bytes fails the sample, naming it
    kTruncate,  // keep its first max_bytes bytes (the length says max_bytes)
  };
  std::string name;                             // the tensor's name: letters, digits, '_'; unique in the batch
  std::string from;                             // the sidecar's ending, e.g. ".txt" (tar: any case)
  int64_t max_bytes = 0;                        // row size, 1..16777216 (required)
  OnMissing on_missing = OnMissing::kError;     // YAML: error | empty
  OnOverflow on_overflow = OnOverflow::kError;  // YAML: error | truncate

  bool operator==(const ExtraOutputConfig&) const = default;
};

// A segmentation mask per sample from a sidecar image (YAML mask: {from: .png, on_missing}): an
// 8-bit grayscale PNG (or any image spdld decodes; colour ones are taken as their luma) of the
// image's stored size, each value a class. Delivered as `mask` uint8 [B, H, W], moved by every
// geometric transform with nearest-neighbour sampling (0 where the output is padding), never
// touched by photometric ones. Image folders, file lists and tar shards (not http, not coco:
// there masks: true rasterises the polygons).
struct MaskConfig {
  std::string from;               // the sidecar's ending, e.g. ".png"; "" = no mask
  bool empty_on_missing = false;  // YAML on_missing: error (the sample fails) | empty (all zero)

  bool operator==(const MaskConfig&) const = default;
};

// Batch-level mixing (YAML mix: {mixup: {alpha}, cutmix: {alpha}, switch_prob, prob, num_classes,
// label_smoothing}), as timm's Mixup / torchvision's references: per batch one of mixup or cutmix
// (cutmix with probability switch_prob when both are given), lambda from Beta(alpha, alpha), each
// row mixed with the batch reversed (media/mix.h). The batch's `label` becomes float32
// [B, num_classes] soft targets (smoothed one-hot, mixed with the same lambda: each row sums to 1).
// Draws from (sampler.seed, epoch, batch index): a rerun or a resumed job mixes the same way.
// media: image; every sample needs a label in [0, num_classes); not with a coco source.
struct MixConfig {
  double mixup_alpha = 0;      // YAML mixup: {alpha}; > 0 (0 = no mixup)
  double cutmix_alpha = 0;     // YAML cutmix: {alpha}; > 0 (0 = no cutmix)
  double switch_prob = 0.5;    // with both: the chance a batch gets cutmix, 0..1
  double prob = 1.0;           // the chance a batch is mixed at all, 0..1
  int num_classes = 0;         // label width, 1..100000 (required with mixup or cutmix)
  double label_smoothing = 0;  // 0..1 (< 1)

  bool enabled() const { return mixup_alpha > 0 || cutmix_alpha > 0; }
  bool operator==(const MixConfig&) const = default;
};

// Opt-in caches of one job (YAML cache: {decoded: {max_side, max_bytes}}).
// decoded: the first read of a sample decodes it and shrinks it so that its longer side is at most
// max_side (aspect kept; PIL's box filter, i.e. area averaging; never enlarged), and keeps that
// image, uncompressed, in memory for the job's later epochs, which then pay no JPEG (PNG, ...)
// decode. The transforms run on the shrunk image: a random crop of a 4000 px photo is resampled
// from at most max_side px. Entries are charged to the daemon's memory budget (never past three
// quarters of it) and to max_bytes; a sample that does not fit is not cached (counted). media:
// image only; not with decode.exif_orientation, a mask, or a coco source (their targets follow the
// stored image size).
struct DecodedCacheConfig {
  int max_side = 0;                      // 16..16384; 0 = off
  int64_t max_bytes = int64_t{1} << 30;  // the job's cap on the cached images, 1 MiB..1 TiB

  bool operator==(const DecodedCacheConfig&) const = default;
};

struct CacheConfig {
  DecodedCacheConfig decoded;

  bool operator==(const CacheConfig&) const = default;
};

struct JobConfig {
  Media media = Media::kImage;  // YAML: image | audio | video
  AudioConfig audio;            // media: audio only (YAML: audio: {...})
  VideoConfig video;            // media: video only (YAML: video: {...})
  SourceConfig source;          // where the samples come from (with `sources`: sources[0]'s)
  // A mix of several sources (YAML sources: [...], 1..64 entries, instead of `source`): samples
  // interleaved by a seeded weighted draw (io/mixed_source.h). Empty for a single `source`. Every
  // entry delivers the same tensors: all coco (with equal max_boxes and masks) or none, and each
  // must allow the job's extra_outputs, mask and mix as `source` would.
  std::vector<WeightedSource> sources;
  SamplerConfig sampler;                         // the order of the samples
  BatchConfig batch;                             // how samples are grouped
  DecodeConfig decode;                           // how each image is decoded (media: image only)
  std::vector<TransformOp> transforms;           // applied to each decoded image, in order; never empty for
                                                 // media: image, always empty (refused) for audio and video
  OutputConfig output;                           // what a delivered batch looks like (dtype and layout:
                                                 // media: image only)
  std::vector<ExtraOutputConfig> extra_outputs;  // sidecar bytes per sample, after `label` (0..16)
  MaskConfig mask;                               // a segmentation mask per sample from a sidecar (media: image)
  MixConfig mix;                                 // batch-level mixup / cutmix (media: image)
  CacheConfig cache;                             // opt-in per-job caches (media: image)
  int prefetch = 4;                              // slots in the job's shared ring, 1..64
  OnError on_error = OnError::kSkip;             // YAML: skip | fail
  StagesConfig stages;                           // per-stage concurrency and queue bounds
  Order order = Order::kSampler;                 // YAML: sampler | completion
  MaxFailures max_failures{-1, 0.5};             // with on_error: skip; default: more than half of the
                                                 // samples tried (after the warm-up) fails the job; a
                                                 // count or fraction given replaces it (1.0: no limit)
  int max_failures_warmup = 100;                 // samples tried before max_failures applies, 0..10^9
  int weight = 1;                                // share of the node's pools against other jobs, 1..1000
  // source.type: stream: a batch not full this long after its first sample is sent with the rows it
  // has (BatchReady.rows says how many); 0 = wait until full (or the stream closes). 0..3600000.
  int64_t max_batch_delay_ms = 0;
  // Identical jobs decode once (jobs/shared_job.h): jobs of one uid with share: true and the same
  // config text, dataset, rank, world size and epochs run one pipeline and every member gets every
  // batch. share_members: the group holds its first batch until this many have joined (1..1024),
  // or until share_wait_seconds have passed since the group was started (0 < s <= 86400): then it
  // starts with the members present (a daemon log line says so), and a late one gets its own group.
  bool share = false;
  int share_members = 1;
  double share_wait_seconds = 60;

  // Output image size after the transforms, computed by the parser (the YAML cannot set these).
  // Both 0 when the chain does not produce a fixed size (never in an image config the parser
  // returns); 0 for audio and video jobs.
  int out_height = 0;
  int out_width = 0;

  bool operator==(const JobConfig&) const = default;
};

// The outcome of parsing a job config: `config` is set iff `errors` is empty.
struct JobConfigResult {
  std::optional<JobConfig> config;  // the validated config (overrides applied)
  std::vector<ConfigError> errors;  // every problem found, sorted by line (no-line ones last)
};

// Parses and validates a job config. `overrides` are applied to the YAML tree, in order, before
// validation; errors about values they set have line 0 and a path "--set <path>". Never throws.
JobConfigResult ParseJobConfig(std::string_view yaml_text, const std::vector<Override>& overrides = {});

// Limits on a job config a client sends, checked before any YAML is parsed (yaml-cpp holds ~200
// bytes per node and recurses per nesting level): its bytes with the overrides', and its nesting
// (block indentation levels plus flow brackets). A real job config is a few KiB, 6 levels deep.
inline constexpr size_t kMaxJobConfigBytes = 64 * 1024;
inline constexpr size_t kMaxJobConfigDepth = 32;
// "" when `text` and `overrides` are within the limits above; else why not.
std::string CheckJobConfigShape(std::string_view text, const std::vector<Override>& overrides);

}  // namespace spdl::config
