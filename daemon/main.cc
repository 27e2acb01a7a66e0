// spdld: the per-node data-loading daemon. Parses the command line, loads the config, sets up
// logging (before any thread starts), builds the Daemon and runs it until it has drained
// (SIGTERM/SIGINT, spdlctl drain). SIGHUP re-reads --config with the same command-line overrides.
#include <malloc.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <thread>

#include "config/daemon_config.h"
#include "daemon.h"

namespace {

// The allocator's settings for a daemon of many threads that pass ~100 kB buffers between them
// (an I/O thread allocates a file's bytes, a worker frees them), measured in bench/README.md
// "Memory": glibc's default of 8 arenas per core with a sliding mmap threshold keeps several MiB
// of freed buffers per arena. At most max(2, workers) arenas, and blocks of 128 KiB or more mapped
// and unmapped on their own (a fixed threshold: freed at once). An arena's free top is given back
// to the kernel only past 2 MiB (glibc's 128 KiB, fixed with the mmap threshold, trimmed and faulted
// in again on nearly every decoded sample, each freeing its encoded file: ~4 % of the daemon's
// CPU; bench/README.md "Memory"). GLIBC_TUNABLES naming a malloc setting leaves the allocator as
// the user set it.
void TuneAllocator(int worker_threads) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables != nullptr && std::strstr(tunables, "glibc.malloc.") != nullptr) return;
  const int workers = worker_threads > 0 ? worker_threads : static_cast<int>(std::thread::hardware_concurrency());
  mallopt(M_ARENA_MAX, std::max(2, workers));  // NOLINT(concurrency-mt-unsafe): before any thread starts
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);       // NOLINT(concurrency-mt-unsafe): before any thread starts
  mallopt(M_TRIM_THRESHOLD, 2 * 1024 * 1024);  // NOLINT(concurrency-mt-unsafe): before any thread starts
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"spdld: the per-node data-loading daemon"};
  app.set_version_flag("--version", std::string("spdld ") + SPDLD_VERSION);
  std::string config_path;
  std::optional<std::string> socket_path;
  std::vector<std::string> allow_roots;
  std::optional<int> threads;
  std::optional<std::string> log_level;
#if SPDL_TEST_HOOKS
  std::string test_fake_gpu_dir;
#endif
  app.add_option("--config", config_path, "daemon config (YAML), e.g. config/spdld.yaml")->check(CLI::ExistingFile);
  app.add_option("--socket", socket_path, "control socket path (overrides the config)");
  app.add_option("--allow-root", allow_roots, "a directory jobs may read below (repeatable; added to the config's)");
  app.add_option("--threads", threads, "worker threads, 0 = one per core (overrides the config)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error|critical|off (overrides the config)");
#if SPDL_TEST_HOOKS
  // TEST ONLY, hidden from --help: GPU jobs run on a cross-process fake device in DIR
  // (cuda/shm_fake_backend.h) instead of CUDA, so end-to-end tests cover the GPU protocol without a GPU.
  app.add_option("--test-only-fake-gpu", test_fake_gpu_dir, "")->group("");
#endif
  CLI11_PARSE(app, argc, argv);

  // The config file (if any) with the command line on top; SIGHUP runs this again.
  auto load = [=]() -> spdl::config::DaemonConfigResult {
    spdl::config::DaemonConfigResult r;
    if (config_path.empty()) {
      r.config.emplace();
    } else {
      r = spdl::config::LoadDaemonConfig(config_path);
      if (!r.config) return r;
    }
    auto& config = *r.config;
    if (socket_path) config.socket_path = *socket_path;
    for (auto& root : allow_roots) config.allowed_roots.push_back(root);
    if (threads) config.worker_threads = *threads;
    if (log_level) config.log_level = *log_level;
    return r;
  };
  auto loaded = load();
  if (!loaded.config) {
    std::cerr << "spdld: invalid config:\n" << spdl::config::FormatConfigErrors(loaded.errors, config_path) << "\n";
    return 2;
  }
  spdl::config::DaemonConfig config = *loaded.config;
  TuneAllocator(config.worker_threads);  // before any thread starts

  auto level = spdlog::level::from_str(config.log_level);
  if (level == spdlog::level::off && config.log_level != "off") {
    std::cerr << "spdld: unknown log level '" << config.log_level << "'\n";
    return 2;
  }
  spdlog::set_level(level);
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ spdld: %v");

  spdl::Daemon daemon(config, config_path.empty() ? spdl::Daemon::ConfigLoader{} : load, config_path);
#if SPDL_TEST_HOOKS
  if (!test_fake_gpu_dir.empty()) daemon.UseFakeGpuForTests(test_fake_gpu_dir);
#endif
  if (auto s = daemon.Start(); !s.ok()) {
    spdlog::critical("{}", s.message());
    return 1;
  }
  daemon.Run();
  return daemon.exit_code();
} catch (const std::exception& e) {  // out of memory, a library's error outside a job: a message and status 1
  std::cerr << "spdld: " << e.what() << "\n";
  return 1;
}
