#include "media/av_input.h"

extern "C" {
#include <libavutil/error.h>
#include <libavutil/log.h>
#include <libavutil/mem.h>
}

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

namespace spdl::media {

std::string AvErrorString(int rc) {
  char buf[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(rc, buf, sizeof(buf));
  return buf;
}

struct AvInput::Reader {
  std::span<const uint8_t> data;
  int64_t pos = 0;

  static int Read(void* opaque, uint8_t* buf, int size) {
    auto* r = static_cast<Reader*>(opaque);
    const int64_t left = static_cast<int64_t>(r->data.size()) - r->pos;
    if (left <= 0) return AVERROR_EOF;
    const int n = static_cast<int>(std::min<int64_t>(left, size));
    std::memcpy(buf, r->data.data() + r->pos, n);
    r->pos += n;
    return n;
  }

  static int64_t Seek(void* opaque, int64_t offset, int whence) {
    auto* r = static_cast<Reader*>(opaque);
    const int64_t size = static_cast<int64_t>(r->data.size());
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE:
        return size;
      case SEEK_SET:
        break;
      case SEEK_CUR:
        offset += r->pos;
        break;
      case SEEK_END:
        offset += size;
        break;
      default:
        return AVERROR(EINVAL);
    }
    if (offset < 0 || offset > size) return AVERROR(EINVAL);
    r->pos = offset;
    return offset;
  }
};

namespace {

// Does `stream` say everything a decoder needs without probing packets?
bool ParametersComplete(const AVStream* s) {
  const AVCodecParameters* p = s->codecpar;
  if (p->codec_id == AV_CODEC_ID_NONE) return false;
  if (p->codec_type == AVMEDIA_TYPE_AUDIO) return p->sample_rate > 0 && p->ch_layout.nb_channels > 0;
  if (p->codec_type == AVMEDIA_TYPE_VIDEO) return p->width > 0 && p->height > 0 && p->format >= 0;
  return true;
}

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Checks the chunks of [begin, end) of a RIFF file, and those of its LIST chunks (to `depth`).
Status CheckRiffChunks(std::span<const uint8_t> d, uint64_t begin, uint64_t end, int depth) {
  uint64_t off = begin;
  while (end - off >= 8) {
    const uint8_t* id = d.data() + off;
    const uint64_t size = Le32(id + 4);
    const uint64_t body = off + 8;
    const bool list = std::memcmp(id, "LIST", 4) == 0;
    // (A second top-level 'RIFF' is an OpenDML AVI's 'AVIX' extension: more media data.)
    const bool media = std::memcmp(id, "data", 4) == 0 || std::memcmp(id, "idx1", 4) == 0 ||
                       std::memcmp(id, "RIFF", 4) == 0 ||
                       (list && body + 4 <= d.size() && std::memcmp(d.data() + body, "movi", 4) == 0);
    if (body + size > d.size()) {
      if (media) return Status::Ok();  // a file cut short in its media data: the demuxer reads what is there
      std::string name;
      for (int i = 0; i < 4; ++i) name += (id[i] >= 0x20 && id[i] < 0x7f) ? static_cast<char>(id[i]) : '?';
      return DataLoss("RIFF chunk '" + name + "' at offset " + std::to_string(off) + " states " + std::to_string(size) +
                      " bytes, past the end of the file (" + std::to_string(d.size()) + " bytes)");
    }
    if (list && !media && size >= 4 && depth > 0) {
      SPDL_RETURN_IF_ERROR(CheckRiffChunks(d, body + 4, body + size, depth - 1));
    }
    off = body + size + (size & 1);
    if (off > end) break;
  }
  return Status::Ok();
}

// RIFF files (WAV, AVI): libavformat allocates some chunks at their stated size before reading
// them (LIST INFO entries, WAV 'bext' history, AVI stream headers), bounded only by the enclosing
// chunk's stated size, so a file of a few hundred bytes could ask for gigabytes
// (tests/fuzz/audio_fuzz). Every chunk other than the media data ('data', 'LIST movi', 'idx1',
// 'RIFF AVIX', which are streamed, and may be cut short in a truncated file) must lie inside the
// file.
Status CheckRiff(std::span<const uint8_t> d) {
  if (d.size() < 12 || std::memcmp(d.data(), "RIFF", 4) != 0) return Status::Ok();
  if (std::memcmp(d.data() + 8, "WAVE", 4) != 0 && std::memcmp(d.data() + 8, "AVI ", 4) != 0) return Status::Ok();
  return CheckRiffChunks(d, 12, d.size(), /*depth=*/4);
}

uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

bool IsBox(const uint8_t* type, const char* name) { return std::memcmp(type, name, 4) == 0; }

std::string BoxName(const uint8_t* type) {
  std::string name;
  for (int i = 0; i < 4; ++i) name += (type[i] >= 0x20 && type[i] < 0x7f) ? static_cast<char>(type[i]) : '?';
  return name;
}

// The bytes one entry of a sample-table box takes, after its version/flags and entry count;
// 0 for a box without such a count.
uint64_t TableEntryBytes(const uint8_t* type, uint8_t version) {
  if (IsBox(type, "stts") || IsBox(type, "ctts") || IsBox(type, "co64") || IsBox(type, "sbgp")) return 8;
  if (IsBox(type, "stss") || IsBox(type, "stps") || IsBox(type, "stco")) return 4;
  if (IsBox(type, "stsc")) return 12;
  if (IsBox(type, "elst")) return version == 1 ? 20 : 12;
  return 0;
}

// Checks one box's entry count against the bytes it has. `body` is the box's content (after the
// size and type), already clamped to its parent as libavformat clamps it.
Status CheckBoxTable(const uint8_t* type, std::span<const uint8_t> body, uint64_t offset, uint64_t file_size) {
  auto refuse = [&](uint64_t entries) {
    return DataLoss("MP4/MOV box '" + BoxName(type) + "' at offset " + std::to_string(offset) + " states " +
                    std::to_string(entries) + " entries, more than its " + std::to_string(body.size()) +
                    " bytes (or the file's " + std::to_string(file_size) + ") can hold");
  };
  if (body.size() < 8) return Status::Ok();  // too short to state a count: libavformat refuses it
  const uint8_t version = body[0];
  if (IsBox(type, "stsz")) {  // version/flags, sample size, count, then a size per sample when the size is 0
    if (body.size() < 12) return Status::Ok();
    const uint64_t sample_size = Be32(body.data() + 4), entries = Be32(body.data() + 8);
    if (sample_size == 0 ? entries * 4 > body.size() - 12 : entries > file_size) return refuse(entries);
    return Status::Ok();
  }
  if (IsBox(type, "stz2")) {  // version/flags, 3 reserved bytes + field size in bits, count, packed sizes
    if (body.size() < 12) return Status::Ok();
    const uint64_t bits = body[7], entries = Be32(body.data() + 8);
    if ((entries * bits + 7) / 8 > body.size() - 12) return refuse(entries);
    return Status::Ok();
  }
  if (IsBox(type, "trun")) {  // a fragment's samples: 0 to 16 bytes each, by the flags
    const uint32_t flags = Be32(body.data()) & 0xffffff;
    const uint64_t entries = Be32(body.data() + 4);
    const uint64_t header = 8 + 4 * (flags & 1) + 4 * ((flags >> 2) & 1);  // data offset, first sample's flags
    const uint64_t each = 4 * (((flags >> 8) & 1) + ((flags >> 9) & 1) + ((flags >> 10) & 1) + ((flags >> 11) & 1));
    if (entries > file_size || (body.size() >= header && entries * each > body.size() - header)) {
      return refuse(entries);
    }
    return Status::Ok();
  }
  const uint64_t each = TableEntryBytes(type, version);
  if (each == 0) return Status::Ok();
  // The count follows the version/flags; 'sbgp' has its grouping type (and, version 1, a parameter) first.
  const uint64_t count_at = IsBox(type, "sbgp") ? (version == 1 ? 12 : 8) : 4;
  if (body.size() < count_at + 4) return Status::Ok();
  const uint64_t entries = Be32(body.data() + count_at);
  if (entries * each > body.size() - count_at - 4) return refuse(entries);
  return Status::Ok();
}

// Walks the boxes of [begin, end) of an MP4/MOV file, into the containers that hold sample tables.
Status CheckIsoBoxes(std::span<const uint8_t> d, uint64_t begin, uint64_t end, int depth) {
  uint64_t off = begin;
  while (end - off >= 8) {
    const uint8_t* type = d.data() + off + 4;
    uint64_t size = Be32(d.data() + off);
    uint64_t header = 8;
    if (size == 1) {
      if (end - off < 16) break;
      size = uint64_t{Be32(d.data() + off + 8)} << 32 | Be32(d.data() + off + 12);
      header = 16;
    } else if (size == 0) {
      size = end - off;  // to the end of the parent
    }
    if (size < header) break;          // libavformat stops reading this container here too
    size = std::min(size, end - off);  // and clamps a box to its parent
    const uint64_t body = off + header, body_end = off + size;
    // The boxes libavformat reads as a list of boxes, wherever they are (it looks a box's reader up
    // by its type alone, so a sample table inside 'dinf' is read too).
    static constexpr const char* kContainers[] = {"moov", "trak", "mdia", "minf", "stbl", "edts", "dinf",
                                                  "mvex", "moof", "traf", "mfra", "tref", "udta", "ilst",
                                                  "sinf", "schi", "wave", "clip", "matt"};
    bool container = false;
    for (const char* c : kContainers) container = container || IsBox(type, c);
    if (IsBox(type, "cmov")) {
      // A compressed movie header (old QuickTime): libavformat inflates it into a buffer of the size
      // it states, from the file.
      return DataLoss("MP4/MOV box 'cmov' at offset " + std::to_string(off) +
                      ": compressed movie headers are not supported");
    }
    if (IsBox(type, "meta")) {
      // libavformat looks for its 'hdlr' child 4 bytes at a time (a QuickTime 'meta' has no
      // version/flags, an ISO one has), then reads the boxes from there.
      for (uint64_t at = body; at + 8 <= body_end; at += 4) {
        if (IsBox(d.data() + at + 4, "hdlr")) {
          if (depth > 0) SPDL_RETURN_IF_ERROR(CheckIsoBoxes(d, at, body_end, depth - 1));
          break;
        }
      }
    } else if (container) {
      if (depth > 0) SPDL_RETURN_IF_ERROR(CheckIsoBoxes(d, body, body_end, depth - 1));
    } else {
      SPDL_RETURN_IF_ERROR(CheckBoxTable(type, d.subspan(body, body_end - body), off, d.size()));
    }
    off = body_end;
  }
  return Status::Ok();
}

// MP4/MOV (ISO base media, QuickTime): libavformat's mov demuxer allocates each sample table at
// the size its entry count states before reading the entries (FFmpeg 5.1: 'stss' asked for 4 bytes
// a keyframe, 'stco' 4 or 8 a chunk, ...; the index then 24 bytes a sample), so a file of a few
// hundred bytes could ask for gigabytes (tests/fuzz/video_fuzz: a 24-byte 'stss' stating 134
// million keyframes, 539 MB). Every sample table's count must fit in the bytes its box has; where
// entries take no bytes (a constant sample size, a 'trun' without per-sample fields) there may be
// no more samples than the file has bytes. Box sizes themselves need no check: libavformat clamps
// a box to its parent and the top level to the file.
// Run whenever libavformat's probe picks its mov demuxer, whatever the first box is: the probe
// scores a file by any known box it finds at the top level, so a file whose first box is garbage
// is still read as MP4 (tests/fuzz/crashes/video: a 4-byte junk type before 'moov').
Status CheckIsoBmff(std::span<const uint8_t> d) {
  if (d.size() < 8) return Status::Ok();
  return CheckIsoBoxes(d, 0, d.size(), /*depth=*/16);
}

}  // namespace

Result<AvInput> AvInput::Open(std::span<const uint8_t> data, AVMediaType needed, const char* what) {
  const std::string kind = what;
  const std::string not_a =
      std::string(std::strchr("aeiou", kind.empty() ? 'x' : kind[0]) ? "not an " : "not a ") + kind;
  if (data.empty()) return DataLoss(not_a + " file: no data");
  if (data.size() > static_cast<size_t>(INT64_MAX / 2)) {
    return ResourceExhausted(kind + " file of " + std::to_string(data.size()) + " bytes is too large");
  }
  if (Status riff = CheckRiff(data); !riff.ok()) {
    return DataLoss(not_a + " file FFmpeg reads: " + riff.message());
  }
  AvInput in;
  in.reader_ = std::make_unique<Reader>();
  in.reader_->data = data;
  constexpr int kIoBufferSize = 32 * 1024;
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBufferSize));
  if (buffer == nullptr) return ResourceExhausted("av_malloc: out of memory");
  in.io_ = avio_alloc_context(buffer, kIoBufferSize, /*write_flag=*/0, in.reader_.get(), &Reader::Read, nullptr,
                              &Reader::Seek);
  if (in.io_ == nullptr) {
    av_free(buffer);
    return ResourceExhausted("avio_alloc_context: out of memory");
  }
  AVFormatContext* fmt = avformat_alloc_context();
  if (fmt == nullptr) return ResourceExhausted("avformat_alloc_context: out of memory");
  fmt->pb = in.io_;
  fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
  // Never follow references to other files (HLS playlists, concat lists, image sequences): the
  // sample is these bytes and nothing else.
  fmt->protocol_whitelist = av_strdup("");
  // Probe first (as avformat_open_input would), so that the checks below run for the demuxer that
  // will read the data, then open with that demuxer (no second probe).
  const AVInputFormat* iformat = nullptr;
  int rc = av_probe_input_buffer2(in.io_, &iformat, "", nullptr, 0, 0);
  if (rc < 0 || iformat == nullptr) {
    avformat_free_context(fmt);
    return DataLoss(not_a + " file FFmpeg reads: " + (rc < 0 ? AvErrorString(rc) : std::string("unknown format")));
  }
  if (std::strstr(iformat->name, "mov") != nullptr) {
    if (Status iso = CheckIsoBmff(data); !iso.ok()) {
      avformat_free_context(fmt);
      return DataLoss(not_a + " file FFmpeg reads: " + iso.message());
    }
  }
  rc = avformat_open_input(&fmt, nullptr, iformat, nullptr);  // frees fmt on failure
  if (rc < 0) return DataLoss(not_a + " file FFmpeg reads: " + AvErrorString(rc));
  in.format_ = fmt;
  bool complete = false;
  for (unsigned i = 0; i < fmt->nb_streams; ++i) {
    if (fmt->streams[i]->codecpar->codec_type == needed) complete = ParametersComplete(fmt->streams[i]);
    if (complete) break;
  }
  if (!complete) {
    rc = avformat_find_stream_info(fmt, nullptr);
    if (rc < 0) return DataLoss("cannot read the " + kind + " stream parameters: " + AvErrorString(rc));
  }
  // The container is identified and its streams described: stop libavformat from probing the
  // codec again from packet data. (WAV with PCM asks for it, to catch AC-3/DTS carried as PCM:
  // the generic code then re-runs every demuxer's probe over the packets read so far at each
  // doubling up to probesize, 5 MB by default — most of the cost of a WAV clip, and ~100 ms for
  // the first packet after a seek. Measured with bench/ops.) Such S/PDIF-in-WAV files decode as
  // the PCM their header says.
  fmt->probesize = 4096;
  return in;
}

AvInput::AvInput(AvInput&& o) noexcept
    : reader_(std::move(o.reader_)), io_(std::exchange(o.io_, nullptr)), format_(std::exchange(o.format_, nullptr)) {}

AvInput& AvInput::operator=(AvInput&& o) noexcept {
  if (this != &o) {
    Close();
    reader_ = std::move(o.reader_);
    io_ = std::exchange(o.io_, nullptr);
    format_ = std::exchange(o.format_, nullptr);
  }
  return *this;
}

AvInput::~AvInput() { Close(); }

void AvInput::Close() noexcept {
  if (format_ != nullptr) avformat_close_input(&format_);  // leaves a custom pb alone
  if (io_ != nullptr) {
    av_freep(static_cast<void*>(&io_->buffer));  // may have been replaced by libavformat: free the current one
    avio_context_free(&io_);
  }
  reader_.reset();
}

Result<AVStream*> AvInput::BestStream(AVMediaType type, const char* what) const {
  const int index = av_find_best_stream(format_, type, -1, -1, nullptr, 0);
  if (index < 0) return DataLoss(std::string("no ") + what + " stream in the file");
  return format_->streams[index];
}

Result<AvCodecContextPtr> AvInput::OpenDecoder(const AVStream* stream, const char* what) {
  const AVCodec* codec = avcodec_find_decoder(stream->codecpar->codec_id);
  if (codec == nullptr) {
    return FailedPrecondition(std::string("this FFmpeg build has no decoder for the ") + what + " codec " +
                              avcodec_get_name(stream->codecpar->codec_id));
  }
  AvCodecContextPtr ctx(avcodec_alloc_context3(codec));
  if (!ctx) return ResourceExhausted("avcodec_alloc_context3: out of memory");
  int rc = avcodec_parameters_to_context(ctx.get(), stream->codecpar);
  if (rc < 0) return DataLoss(std::string("bad ") + what + " codec parameters: " + AvErrorString(rc));
  ctx->pkt_timebase = stream->time_base;
  ctx->thread_count = 1;
  ctx->log_level_offset = AV_LOG_DEBUG - AV_LOG_ERROR;
  rc = avcodec_open2(ctx.get(), codec, nullptr);
  if (rc < 0) {
    return DataLoss(std::string("cannot open the ") + codec->name + " decoder: " + AvErrorString(rc));
  }
  return ctx;
}

double StreamSeconds(const AVStream* stream, int64_t ts) {
  const int64_t start = stream->start_time == AV_NOPTS_VALUE ? 0 : stream->start_time;
  return static_cast<double>(ts - start) * av_q2d(stream->time_base);
}

DecodeLoopEnd DecodeStream(const AvInput& in, AVCodecContext* decoder, int stream_index, const std::string& what,
                           AVPacket* packet, AVFrame* frame, const std::function<bool()>& done,
                           const std::function<Status(AVFrame*)>& consume) {
  auto receive = [&]() -> Status {
    while (!done()) {
      const int rc = avcodec_receive_frame(decoder, frame);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return Status::Ok();
      if (rc < 0) return DataLoss("corrupt " + what + ": " + AvErrorString(rc));
      Status s = consume(frame);
      av_frame_unref(frame);
      SPDL_RETURN_IF_ERROR(s);
    }
    return Status::Ok();
  };
  DecodeLoopEnd end;
  while (end.status.ok() && !done() && !end.eof) {
    int rc = av_read_frame(in.format(), packet);
    if (rc == AVERROR_EOF) {
      end.eof = true;
      rc = avcodec_send_packet(decoder, nullptr);
    } else if (rc < 0) {
      end.status = DataLoss("cannot read the " + what + ": " + AvErrorString(rc));
      break;
    } else if (packet->stream_index != stream_index) {
      av_packet_unref(packet);
      continue;
    } else {
      rc = avcodec_send_packet(decoder, packet);
      av_packet_unref(packet);
    }
    if (rc < 0 && rc != AVERROR(EAGAIN) && rc != AVERROR_EOF) {
      end.status = DataLoss("corrupt " + what + ": " + AvErrorString(rc));
      break;
    }
    end.status = receive();
  }
  return end;
}

}  // namespace spdl::media
