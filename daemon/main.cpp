// cxltierd: parse flags, load the configuration, wire the layers, run.
#include <grp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>

#include "cxltier/socket_path.h"
#include "numa/migrator.h"
#include "numa/topology.h"
#include "server/http.h"
#include "server/server.h"
#include "service/config.h"
#include "service/daemon.h"
#include "service/status.h"
#include "systemd.h"

namespace {

using cxltier::service::DaemonConfig;

// Where a daemon started by an ordinary user keeps its socket and state.
void UserDefaults(DaemonConfig* c) {
  const std::string uid = std::to_string(getuid());
  c->socket_path = cxltier::UserSocketPath();
  const char* state = std::getenv("XDG_STATE_HOME");
  const char* home = std::getenv("HOME");
  c->state_dir = state && *state ? std::string(state) + "/cxltierd"
                 : home && *home ? std::string(home) + "/.local/state/cxltierd"
                                 : "/tmp/cxltierd-" + uid + "-state";
}

// Under systemd, StateDirectory= and RuntimeDirectory= say where (the file
// and flags still override).
void SystemdDefaults(DaemonConfig* c) {
  if (const char* state = std::getenv("STATE_DIRECTORY"); state && *state) {
    c->state_dir = std::string(state).substr(0, std::string(state).find(':'));
  }
  if (const char* run = std::getenv("RUNTIME_DIRECTORY"); run && *run) {
    c->socket_path =
        std::string(run).substr(0, std::string(run).find(':')) + "/" + cxltier::kSocketFileName;
  }
}

// The defaults before any file or flag: built in, then per user, then systemd's.
DaemonConfig Defaults(bool root) {
  DaemonConfig c;
  if (!root) UserDefaults(&c);
  SystemdDefaults(&c);
  return c;
}

// Every client holds a socket, and a memfd pool's fd until it is mapped: the
// usual soft limit of 1024 runs out long before the hard limit that the
// administrator (or LimitNOFILE=) chose for us.
void RaiseFdLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) {
    spdlog::warn("file descriptors: getrlimit: {}", std::strerror(errno));
    return;
  }
  if (r.rlim_cur >= r.rlim_max) {
    spdlog::info("file descriptors: limit {}", r.rlim_cur);
    return;
  }
  const rlim_t soft = r.rlim_cur;
  r.rlim_cur = r.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &r) != 0) {
    spdlog::warn("file descriptors: raising the soft limit {} to {}: {}", soft, r.rlim_max,
                 std::strerror(errno));
    return;
  }
  spdlog::info("file descriptors: soft limit raised from {} to the hard limit {}", soft,
               r.rlim_cur);
}

spdlog::level::level_enum SpdlogLevel(cxltier::server::LogLevel level) {
  switch (level) {
    case cxltier::server::LogLevel::kDebug:
      return spdlog::level::debug;
    case cxltier::server::LogLevel::kInfo:
      return spdlog::level::info;
    case cxltier::server::LogLevel::kWarn:
      return spdlog::level::warn;
    case cxltier::server::LogLevel::kError:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltierd: keeps the hottest KV-cache blocks in DRAM and the rest in CXL memory"};
  std::string config_file, socket_path, state_dir, log_level;
  bool print_config = false;
  app.add_option("--config", config_file, "TOML configuration file");
  app.add_option("--socket", socket_path, "client socket path");
  app.add_option("--state-dir", state_dir, "directory for ghost checkpoints");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error");
  app.add_flag("--print-config", print_config, "print the effective configuration and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const bool root = geteuid() == 0;
  DaemonConfig config = Defaults(root);
  if (!config_file.empty()) {
    if (cxltier::Status st = cxltier::service::LoadConfigFile(config_file, &config); !st.ok()) {
      std::fprintf(stderr, "cxltierd: %s\n", st.message.c_str());
      return 2;
    }
  }
  if (!socket_path.empty()) config.socket_path = socket_path;
  if (!state_dir.empty()) config.state_dir = state_dir;
  if (!log_level.empty()) config.log_level = log_level;
  if (cxltier::Status st = config.Validate(); !st.ok()) {
    std::fprintf(stderr, "cxltierd: configuration: %s\n", st.message.c_str());
    return 2;
  }
  if (print_config) {
    std::fputs(cxltier::service::ToToml(config).c_str(), stdout);
    return 0;
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  if (cxltier::systemd::LoggingToJournal()) {
    cxltier::systemd::UseJournalLogFormat();  // the journal adds the time
  } else {
    spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
  }
  RaiseFdLimit();

  const cxltier::numa::Topology topo = cxltier::numa::Discover();
  cxltier::Result<cxltier::numa::TierAssignment> assigned =
      config.tier_nodes.empty()
          ? cxltier::numa::AssignTiers(topo, config.fast_nodes, config.slow_nodes)
          : cxltier::numa::AssignTiers(topo, config.tier_nodes);
  if (!assigned.ok()) {
    spdlog::critical("tiers: {}", assigned.status().message);
    return 2;
  }
  cxltier::numa::TierAssignment tiers = std::move(*assigned);
  std::string tier_error;
  if (!config.lower_tier_budget_bytes.empty() &&
      config.lower_tier_budget_bytes.size() + 2 > tiers.count()) {
    tier_error = "[tiers] budgets gives " +
                 std::to_string(config.lower_tier_budget_bytes.size() + 1) + " budgets, for " +
                 std::to_string(tiers.count()) +
                 " tiers (one per tier but the last, which holds the rest)";
  }
  if (tier_error.empty()) {
    if (cxltier::Status st =
            cxltier::service::CheckQuotaTiers(config, std::max<size_t>(2, tiers.count()));
        !st.ok()) {
      tier_error = st.message;
    }
  }
  if (!tier_error.empty()) {
    spdlog::critical("tiers: {}", tier_error);
    return 2;
  }
  spdlog::info("topology ({}): {} nodes; tiers: {}", topo.source, topo.nodes.size(), tiers.why);
  std::string desc = cxltier::numa::Describe(topo, tiers);
  for (size_t pos = 0, nl; (nl = desc.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    spdlog::info("  {}", desc.substr(pos, nl - pos));
  }
  bool can_migrate = config.migrate;
  if (!tiers.has_slow()) {
    spdlog::warn(
        "no slow tier: no memory-only NUMA node and no [tiers] override; page mode scores "
        "only (copy mode with a device-DAX tier 1 still moves blocks)");
  }
  if (can_migrate && tiers.has_slow() && cxltier::numa::KernelNumaBalancing() == 1) {
    spdlog::warn(
        "kernel NUMA balancing is on (kernel.numa_balancing = 1): it moves pages that "
        "have no memory policy back to the CPUs' node, undoing demotions of "
        "address-range pools; set it to 0, or 2 for memory tiering");
  }
  if (config.migrate && !cxltier::numa::HaveSysNice()) {
    spdlog::warn(
        "no CAP_SYS_NICE: shared pools cannot be moved (MPOL_MF_MOVE_ALL); "
        "page-mode migration off, scoring only (copy mode still moves blocks)");
    can_migrate = false;
  }

  boost::asio::io_context io;
  cxltier::service::Daemon daemon(io, config, topo, tiers, cxltier::numa::MakeLinuxMigrator(),
                                  can_migrate);
  if (cxltier::Status st = daemon.Start(); !st.ok()) {
    spdlog::critical("{}", st.message);
    return 1;
  }
  cxltier::server::ServerOptions sopts;
  sopts.max_message_bytes = config.max_message_bytes;
  sopts.max_reply_bytes = config.max_reply_bytes;
  sopts.reply_stall_timeout = std::chrono::seconds(config.reply_stall_timeout_s);
  sopts.max_input_bytes_per_uid = config.max_input_bytes_per_uid;
  sopts.frame_timeout = std::chrono::seconds(config.frame_timeout_s);
  sopts.idle_timeout = std::chrono::seconds(config.idle_timeout_s);
  // Rate-limited per uid there: a client repeating a bad frame, or churning
  // connections, must not flood the journal.
  sopts.on_protocol_error = [&daemon](const cxltier::server::Peer& p, const std::string& what) {
    daemon.ClientWarning(p, what);
  };
  sopts.log = [](cxltier::server::LogLevel level, const std::string& what) {
    spdlog::log(SpdlogLevel(level), "{}", what);
  };
  sopts.peer_log = &daemon.peer_log();
  cxltier::server::Server server(io, daemon.requests(), sopts);
  // Socket activation: systemd's socket (cxltierd.socket sets its mode and
  // group); otherwise our own, mode 0660, group socket_group.
  const cxltier::Result<int> activated = cxltier::systemd::ListenFd();
  if (!activated.ok()) {
    spdlog::critical("socket activation: {}", activated.status().message);
    return 1;
  }
  if (const int listen_fd = *activated; listen_fd >= 0) {
    if (cxltier::Status st = server.Adopt(listen_fd); !st.ok()) {
      spdlog::critical("cannot use systemd's socket: {}", st.message);
      return 1;
    }
    spdlog::info("listening on the socket systemd passed (fd {}); state in {}", listen_fd,
                 config.state_dir);
  } else {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(config.socket_path).parent_path(),
                                        ec);
    gid_t socket_gid = static_cast<gid_t>(-1);
    if (!config.socket_group.empty()) {
      if (const group* g = getgrnam(config.socket_group.c_str())) {
        socket_gid = g->gr_gid;
      } else if (root) {
        spdlog::warn("socket group '{}' does not exist: only root can connect to {}",
                     config.socket_group, config.socket_path);
      }
    }
    cxltier::Status group_status;
    if (cxltier::Status st = server.Listen(config.socket_path, 0660, socket_gid, &group_status);
        !st.ok()) {
      spdlog::critical("cannot listen: {}", st.message);
      return 1;
    }
    if (!group_status.ok()) {
      spdlog::warn("{}: group {}: {}", config.socket_path, config.socket_group,
                   group_status.message);
    }
    spdlog::info("listening on {} (mode 0660, group {}); state in {}", config.socket_path,
                 config.socket_group.empty() ? "unchanged" : config.socket_group, config.state_dir);
  }
  cxltier::systemd::Notifier notifier(io);
  cxltier::server::MetricsServer metrics(io, [&daemon] { return daemon.MetricsText(); });
  if (config.metrics_enabled) {
    // Metrics are for operators: a taken port turns them off, not the daemon.
    if (cxltier::Status st = metrics.Listen(config.metrics_listen); !st.ok()) {
      spdlog::error("metrics off: {}", st.message);
    } else {
      daemon.set_metrics_endpoint(metrics.bound());
      spdlog::info("metrics: http://{}/metrics", metrics.bound());
    }
  }

  boost::asio::signal_set stop_signals(io, SIGINT, SIGTERM);
  stop_signals.async_wait([&](const boost::system::error_code& e, int sig) {
    if (e) return;
    spdlog::info("signal {}: stopping", sig);
    notifier.Stopping();
    metrics.Stop();
    server.Stop();
    daemon.Stop();
    io.stop();
  });
  // SIGHUP and `cxltierctl reload`: re-read the file; a bad one changes nothing.
  auto reload = [&]() -> cxltier::Status {
    notifier.Reloading();
    DaemonConfig fresh = Defaults(root);
    cxltier::Status st = config_file.empty()
                             ? cxltier::Status::Ok()
                             : cxltier::service::LoadConfigFile(config_file, &fresh);
    if (st.ok()) st = fresh.Validate();
    if (st.ok()) st = daemon.CheckReload(fresh);
    if (st.ok()) {
      daemon.Reload(fresh);
    } else {
      spdlog::error("reload refused, keeping the running configuration: {}", st.message);
    }
    notifier.ReloadDone();
    return st;
  };
  daemon.set_reload_hook(reload);
  daemon.set_server_counters([&server] { return server.counters(); });
  boost::asio::signal_set hup(io, SIGHUP);
  std::function<void()> arm_hup = [&] {
    hup.async_wait([&](const boost::system::error_code& e, int) {
      if (e) return;
      reload();
      arm_hup();
    });
  };
  arm_hup();
  // STATUS: one line for `systemctl status`.
  notifier.Ready([&daemon] { return cxltier::service::SystemdStatusLine(daemon.Snapshot()); });
  // Handlers catch what they expect; anything else must not take every
  // client down with it: log it and keep serving.
  for (;;) {
    try {
      io.run();
      break;
    } catch (const std::exception& e) {
      spdlog::critical("uncaught exception in the I/O loop (serving on): {}", e.what());
    } catch (...) {
      spdlog::critical("uncaught non-standard exception in the I/O loop (serving on)");
    }
  }
  spdlog::info("stopped");
  return 0;
}
