// Bad data end to end: a real spdld and real clients over a corpus, generated here, with every
// kind of bad file a dataset on a shared node may hold. With on_error: skip the epoch delivers
// every good sample exactly once and counts each bad file; with on_error: fail the job fails naming
// the file and the reason; either way the daemon stays up, leaks no descriptor and serves the next
// job.
//
// When the test runs as root the daemon runs as a test user (created with useradd), so that a
// file with mode 000 is really unreadable to it; without root the daemon runs as the test's own
// (non-root) user, which cannot read it either.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "e2e/daemon_process.h"
#include "e2e/dataset.h"
#include "e2e/e2e_support.h"
#include "media/image_encoder.h"
#include "skip.h"
#include "spdl/client.h"

namespace spdl {
namespace {

namespace fs = std::filesystem;
using testing::DaemonProcess;
using testing::RunAs;
using testing::TempDir;
using testing::WriteFile;

// One kind of bad file: where it goes (relative to the source root), how it is made, and a word
// the daemon's reason for refusing it must contain (lower case; any one of them).
struct BadFile {
  std::string rel;
  std::vector<std::string> reason_words;
};

// A baseline JPEG whose SOF header is patched to claim 60000 x 60000 pixels (3.6 gigapixels): the
// decoder's max_pixels guard must refuse it from the header, before allocating anything.
std::vector<uint8_t> BombJpeg(std::vector<uint8_t> jpeg) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && (jpeg[i + 1] == 0xC0 || jpeg[i + 1] == 0xC1 || jpeg[i + 1] == 0xC2)) {
      // FFCx, length (2), precision (1), height (2), width (2)
      jpeg[i + 5] = 60000 >> 8;
      jpeg[i + 6] = 60000 & 0xFF;
      jpeg[i + 7] = 60000 >> 8;
      jpeg[i + 8] = 60000 & 0xFF;
      return jpeg;
    }
  }
  FAIL("no SOF marker in the generated JPEG");
  return jpeg;
}

// A valid PNG whose IHDR chunk's CRC is wrong (bytes 29..32: signature 8, length 4, type 4, data 13).
std::vector<uint8_t> BrokenCrcPng() {
  media::RawImage img;
  img.width = 40;
  img.height = 30;
  img.data.resize(40 * 30 * 3);
  for (size_t i = 0; i < img.data.size(); ++i) img.data[i] = static_cast<uint8_t>(i * 7);
  auto png = media::EncodeImage(media::ImageFormat::kPng, img);
  REQUIRE(png.ok());
  std::vector<uint8_t> bytes = *png;
  REQUIRE(bytes.size() > 40);
  REQUIRE(std::string(bytes.begin() + 12, bytes.begin() + 16) == "IHDR");
  bytes[29] ^= 0x5A;
  return bytes;
}

struct Corpus {
  // Writes a good dataset (classes x per_class JPEGs) below `root` and the bad files; returns the
  // bad files that are samples (listed by the image-folder scan). Also writes a symlink loop and a
  // directory named like an image, which the scan must not take as samples at all.
  static std::vector<BadFile> Write(const std::string& root, int classes, int per_class, bool unreadable_ok,
                                    std::vector<testdata::GeneratedImage>* good) {
    testdata::DatasetOptions o;
    o.classes = classes;
    o.images_per_class = per_class;
    o.min_side = 60;
    o.max_side = 160;
    auto r = testdata::MakeImageFolder(root, o);
    REQUIRE(r.ok());
    *good = *r;
    const std::string c0 = root + "/class_000/", c1 = root + "/class_" + (classes > 1 ? "001" : "000") + "/";
    auto jpeg = testing::ReadBytes(root + "/" + good->front().path);
    REQUIRE(jpeg.size() > 1000);

    std::vector<BadFile> bad;
    WriteFile(c0 + "bad_truncated.jpg", jpeg.data(), jpeg.size() / 2);
    bad.push_back({"class_000/bad_truncated.jpg", {"truncated", "premature", "corrupt", "jpeg"}});
    std::string noise(5000, '\0');
    uint64_t s = 12345;
    for (char& c : noise) c = static_cast<char>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    WriteFile(c0 + "bad_random.jpg", noise);
    bad.push_back({"class_000/bad_random.jpg", {"not a", "unknown", "format", "jpeg", "corrupt"}});
    WriteFile(c0 + "bad_empty.jpg", "");
    bad.push_back({"class_000/bad_empty.jpg", {"empty", "0 bytes", "too short", "truncated"}});
    auto bomb = BombJpeg(jpeg);
    WriteFile(c1 + "bad_bomb.jpg", bomb.data(), bomb.size());
    bad.push_back({c1.substr(root.size() + 1) + "bad_bomb.jpg", {"pixels"}});
    auto png = BrokenCrcPng();
    WriteFile(c1 + "bad_crc.png", png.data(), png.size());
    bad.push_back({c1.substr(root.size() + 1) + "bad_crc.png", {"crc", "invalid data", "corrupt", "png"}});
    if (unreadable_ok) {
      WriteFile(c0 + "bad_unreadable.jpg", jpeg.data(), jpeg.size());
      REQUIRE(::chmod((c0 + "bad_unreadable.jpg").c_str(), 0) == 0);
      bad.push_back({"class_000/bad_unreadable.jpg", {"permission denied"}});
    }
    // Sorts last, so that it is read long after the job was submitted (see VanishAfterSubmit).
    WriteFile(c1 + "zz_vanishes.jpg", jpeg.data(), jpeg.size());
    bad.push_back({c1.substr(root.size() + 1) + "zz_vanishes.jpg", {"no such file"}});

    // Not samples: a symlink loop (stat fails with ELOOP) and a directory named like a file.
    fs::create_symlink("loop_b.jpg", c0 + "loop_a.jpg");
    fs::create_symlink("loop_a.jpg", c0 + "loop_b.jpg");
    fs::create_directory(c0 + "folder.jpg");
    return bad;
  }
};

std::string JobYaml(const std::string& root, const std::string& on_error) {
  std::ostringstream y;
  y << "source: {type: image_folder, root: " << root << ", extensions: [.jpg, .png]}\n"
    << "sampler: {shuffle: false}\n"
    << "batch: {size: 4, drop_last: false}\n"
    << "transforms: [{resize: {height: 32, width: 32}}]\n"
    << "prefetch: 2\n"
    << "on_error: " << on_error << "\n";
  return y.str();
}

struct Run {
  std::vector<std::multiset<std::string>> epochs;  // paths delivered per epoch
  uint64_t dataset_size = 0;
  uint64_t skipped = 0;
  uint64_t samples = 0;
  std::string error;
};

// Opens a job, calls `after_open` (e.g. to delete a file the job has listed), then reads it to the end.
Run RunJob(const std::string& socket, const std::string& yaml, uint32_t epochs,
           const std::function<void()>& after_open) {
  Run run;
  client::Options o;
  o.socket_path = socket;
  o.config_yaml = yaml;
  o.config_name = "bad_data.yaml";
  o.epochs = epochs;
  auto loader = client::Loader::Open(o);
  if (!loader.ok()) {
    run.error = loader.status().ToString();
    return run;
  }
  run.dataset_size = (*loader)->info().dataset_size;
  if (after_open) after_open();
  for (;;) {
    auto ev = (*loader)->Next();
    if (!ev.ok()) {
      run.error = ev.status().ToString();
      return run;
    }
    if (auto* b = std::get_if<client::Batch>(&*ev)) {
      if (run.epochs.size() <= b->epoch()) run.epochs.resize(b->epoch() + 1);
      run.epochs[b->epoch()].insert(b->paths().begin(), b->paths().end());
    } else if (auto* st = std::get_if<client::JobStats>(&*ev)) {
      run.skipped = st->skipped;
      run.samples = st->samples;
      return run;
    }
  }
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The daemon's user: a test user when root (so mode 000 means unreadable), else ourselves.
struct DaemonUser {
  DaemonUser() {
    if (::geteuid() == 0) {
      auto u = testing::TestUser("spdl-e2e-daemon");
      if (u) {
        as = *u;
      } else {
        unreadable_ok = false;
        SPDL_SKIP_PART(
            "the unreadable-file case (root cannot create the test user spdl-e2e-daemon, and root reads mode 000 "
            "files)");
      }
    }
  }
  RunAs as;
  bool unreadable_ok = true;
};

// A directory the daemon (maybe a test user) can create its socket in.
std::string SocketDir(const TempDir& dir, const RunAs& as) {
  const std::string run = dir.path + "/run";
  fs::create_directory(run);
  if (as.uid >= 0) REQUIRE(::chown(run.c_str(), static_cast<uid_t>(as.uid), static_cast<gid_t>(as.gid)) == 0);
  return run;
}

TEST_CASE("bad files are skipped and counted exactly, good ones delivered once, and the daemon carries on") {
  DaemonUser user;
  TempDir dir(0755);
  const std::string root = dir.path + "/data";
  std::vector<testdata::GeneratedImage> good;
  const auto bad = Corpus::Write(root, 2, 6, user.unreadable_ok, &good);
  const std::string sock = SocketDir(dir, user.as) + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path, "--threads", "2"}, user.as);
  REQUIRE(d.Connectable());
  const int fds_before = testing::FdCount(d.pid());

  Run r = RunJob(sock, JobYaml(root, "skip"), 2, [&] { REQUIRE(fs::remove(root + "/" + bad.back().rel)); });
  INFO(r.error);
  REQUIRE(r.error.empty());
  // Listed: the good files and the bad ones; not the symlink loop nor the directory.
  CHECK(r.dataset_size == good.size() + bad.size());
  REQUIRE(r.epochs.size() == 2);
  std::multiset<std::string> want;
  for (auto& g : good) want.insert(g.path);
  for (auto& e : r.epochs) CHECK(e == want);  // every good sample exactly once, no bad one
  CHECK(r.skipped == 2 * bad.size());
  CHECK(r.samples == 2 * good.size());

  // The daemon is alive, serves another job, and holds no more descriptors than before.
  Run again = RunJob(sock, JobYaml(root, "skip"), 1, nullptr);
  CHECK(again.error.empty());
  CHECK(again.samples == good.size());
  int fds_after = -1;
  for (int i = 0; i < 100 && (fds_after = testing::FdCount(d.pid())) != fds_before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(fds_after == fds_before);
  CHECK(d.Stop() == std::optional<int>(0));
}

TEST_CASE("with on_error fail each kind of bad file fails the job naming the file and the reason") {
  DaemonUser user;
  TempDir dir(0755);
  // One small dataset per kind of bad file, so that each failure is that file's.
  std::vector<testdata::GeneratedImage> good;
  const auto kinds = Corpus::Write(dir.path + "/all", 2, 2, user.unreadable_ok, &good);
  const std::string sock = SocketDir(dir, user.as) + "/spdld.sock";
  DaemonProcess d(sock, {"--allow-root", dir.path, "--threads", "2"}, user.as);
  REQUIRE(d.Connectable());

  for (const BadFile& b : kinds) {
    DYNAMIC_SECTION("bad file " << b.rel) {
      // A root with twelve good files and this bad one, in the bad one's class folder: the bad
      // file sorts last, beyond the rows of the first two slots, so a file that vanishes after
      // the submit is not read before it is gone.
      const std::string root = dir.path + "/only_" + fs::path(b.rel).stem().string();
      const std::string cls = fs::path(b.rel).parent_path().string();
      fs::create_directories(root + "/" + cls);
      constexpr int kGood = 12;
      for (int i = 0; i < kGood; ++i) {
        fs::copy_file(dir.path + "/all/" + good[static_cast<size_t>(i) % good.size()].path,
                      root + "/" + cls + "/good_" + std::to_string(10 + i) + ".jpg");
      }
      const bool vanishes = b.rel.find("vanishes") != std::string::npos;
      const std::string target = root + "/" + b.rel;
      if (fs::path(b.rel).filename() == "bad_unreadable.jpg") {
        ::chmod((dir.path + "/all/" + b.rel).c_str(), 0644);
        fs::copy_file(dir.path + "/all/" + b.rel, target);
        ::chmod(target.c_str(), 0);
      } else {
        fs::copy_file(dir.path + "/all/" + b.rel, target);
      }
      // The bad file must sort last in its root for the vanishing case.
      if (vanishes) REQUIRE(fs::path(b.rel).filename().string() > "good_");
      Run r = RunJob(sock, JobYaml(root, "fail"), 1, [&] {
        if (vanishes) REQUIRE(fs::remove(target));
      });
      INFO("error: " << r.error);
      REQUIRE_FALSE(r.error.empty());
      CHECK_THAT(r.error, Catch::Contains(fs::path(b.rel).filename().string()));
      bool reason = false;
      for (auto& w : b.reason_words) reason = reason || Lower(r.error).find(w) != std::string::npos;
      CHECK(reason);

      // Still up: the same root with on_error: skip runs to the end without the bad file.
      Run ok = RunJob(sock, JobYaml(root, "skip"), 1, nullptr);
      CHECK(ok.error.empty());
      CHECK(ok.samples == kGood);
      CHECK(ok.skipped == (vanishes ? 0 : 1));
    }
  }
  CHECK(d.Stop() == std::optional<int>(0));
}

}  // namespace
}  // namespace spdl
