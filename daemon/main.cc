// spdld: the per-node data-loading daemon. Parses the command line, loads the config, sets up
// logging (before any thread starts), builds the Daemon and runs it until it has drained
// (SIGTERM/SIGINT, spdlctl drain). SIGHUP re-reads --config with the same command-line overrides.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "config/daemon_config.h"
#include "daemon.h"

int main(int argc, char** argv) {
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
  app.add_option("--threads", threads, "worker threads, 0 = one per core (overrides the config)")->check(CLI::NonNegativeNumber);
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
}
