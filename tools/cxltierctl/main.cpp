// cxltierctl: the operator's command line.
#include <fcntl.h>
#include <pwd.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "cxltier/model.h"
#include "cxltier/socket_path.h"
#include "plan.h"
#include "share.h"

namespace {

using cxltier::ModelGeometry;

struct PlanFlags {
  std::string model = std::string(cxltier::kDefaultModel.name);
  std::string context = "128k";
  bool json = false;
  bool per_layer = false;
  std::optional<uint32_t> layers, query_heads, kv_heads, head_dim, dtype_bytes, block_tokens;
};

int RunPlan(const PlanFlags& f) {
  std::optional<ModelGeometry> model = cxltier::FindModelPreset(f.model);
  if (!model) {
    std::string names;
    for (const ModelGeometry& m : cxltier::kModelPresets) names += " " + std::string(m.name);
    std::fprintf(stderr, "cxltierctl plan: unknown model '%s'; presets:%s\n", f.model.c_str(),
                 names.c_str());
    return 2;
  }
  bool custom = false;
  auto apply = [&custom](const std::optional<uint32_t>& flag, uint32_t& field) {
    if (flag) {
      field = *flag;
      custom = true;
    }
  };
  apply(f.layers, model->layers);
  apply(f.query_heads, model->query_heads);
  apply(f.kv_heads, model->kv_heads);
  apply(f.head_dim, model->head_dim);
  apply(f.dtype_bytes, model->dtype_bytes);
  apply(f.block_tokens, model->block_tokens);
  if (custom) model->name = "custom";
  if (const cxltier::Status st = model->Validate(); !st.ok()) {
    std::fprintf(stderr, "cxltierctl plan: invalid geometry: %s\n", st.message.c_str());
    return 2;
  }
  const std::optional<uint64_t> tokens = cxltier::ParseSize(f.context);
  if (!tokens || *tokens == 0 || *tokens > (uint64_t{1} << 40)) {
    std::fprintf(stderr,
                 "cxltierctl plan: --context '%s' is not a token count between 1 and 2^40 "
                 "(examples: 131072, 128k, 1M)\n",
                 f.context.c_str());
    return 2;
  }
  if (f.per_layer) {
    std::vector<ModelGeometry> models(std::begin(cxltier::kModelPresets),
                                      std::end(cxltier::kModelPresets));
    if (custom) models.push_back(*model);
    if (f.json) {
      std::cout << cxltier::ctl::PerLayerJson(models, *tokens).dump(2) << "\n";
    } else {
      std::cout << cxltier::ctl::PerLayerTable(models, *tokens);
    }
    return 0;
  }
  if (f.json) {
    std::cout << cxltier::ctl::PlanJson(*model, *tokens).dump(2) << "\n";
  } else {
    std::cout << cxltier::ctl::PlanTable(*model, *tokens);
  }
  return 0;
}

// "tier 1 (nodes 1): 12 blocks, 12.0 MiB of 1.0 GiB, 150 ns": the budget when
// the tier has one, HMAT read latency when every node's is known.
std::string TierText(const nlohmann::json& t) {
  std::string nodes, latency;
  bool latency_known = !t["nodes"].empty();
  for (const auto& n : t["nodes"]) {
    nodes += (nodes.empty() ? "" : ",") + std::to_string(n["node"].get<int>());
    if (!n.contains("read_latency_ns")) {
      latency_known = false;
    } else {
      latency +=
          (latency.empty() ? "" : "/") + std::to_string(n["read_latency_ns"].get<uint64_t>());
    }
  }
  const uint64_t budget = t.value("budget_bytes", uint64_t{0});
  return "tier " + std::to_string(t["tier"].get<int>()) + " (nodes " +
         (nodes.empty() ? "-" : nodes) + "): " + std::to_string(t["blocks"].get<uint64_t>()) +
         " blocks, " + cxltier::FormatBytes(t["used_bytes"].get<uint64_t>()) +
         (budget > 0 ? " of " + cxltier::FormatBytes(budget) : "") +
         (latency_known ? ", " + latency + " ns" : "");
}

// A uid's login name from the password database ("" when it has none).
std::string UserName(uint32_t uid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || !found) return "";
  return found->pw_name;
}

// Every user's share of the tiers and its quota (status's "quotas"), with a
// title line; "" when there is no row.
std::string SharesText(const nlohmann::json& status) {
  if (!status.contains("quotas")) return "";
  const nlohmann::json& q = status["quotas"];
  const uint64_t tier0_used = status.contains("tiers") && !status["tiers"].empty()
                                  ? status["tiers"][0].value("used_bytes", uint64_t{0})
                                  : 0;
  const std::string table = cxltier::ctl::ShareTable(q, tier0_used, UserName);
  if (table.empty()) return "";
  return "users (share of tier 0's blocks; used/cap per tier; " +
         std::to_string(q.value("quota_evictions", uint64_t{0})) + " quota evictions):\n" + table;
}

void PrintReadable(const std::string& what, const nlohmann::json& j) {
  if (what == "status") {
    std::printf("clients %llu, blocks %llu, ghosts %llu, policy %s (%s), tick %llu ms\n",
                j["clients"].get<unsigned long long>(), j["blocks"].get<unsigned long long>(),
                j["ghosts"].get<unsigned long long>(), j["policy"].get<std::string>().c_str(),
                j["persist"].get<bool>() ? "persist" : "reset",
                j["tick_ms"].get<unsigned long long>());
    if (const auto sh = j.find("shards"); sh != j.end() && sh->is_object()) {
      std::printf("shards: leader %s, %llu switches, %llu sampled touches (rate %g)\n",
                  (*sh)["leader"].get<std::string>().c_str(),
                  (*sh)["switches"].get<unsigned long long>(),
                  (*sh)["sampled_touches"].get<unsigned long long>(), (*sh)["rate"].get<double>());
    }
    std::printf("touches %llu, hits %llu (%.1f%%)\n", j["touches"].get<unsigned long long>(),
                j["hits"].get<unsigned long long>(), 100.0 * j["hit_rate"].get<double>());
    for (const auto& t : j["tiers"]) std::printf("%s\n", TierText(t).c_str());
    const auto& m = j["migrations"];
    std::printf(
        "migrations %s: %llu promotions (%s), %llu demotions (%s), %llu failed, %llu pending\n",
        m["enabled"].get<bool>() ? "on" : "off", m["promotions"].get<unsigned long long>(),
        cxltier::FormatBytes(m["promoted_bytes"].get<uint64_t>()).c_str(),
        m["demotions"].get<unsigned long long>(),
        cxltier::FormatBytes(m["demoted_bytes"].get<uint64_t>()).c_str(),
        m["failed"].get<unsigned long long>(), m["pending"].get<unsigned long long>());
    if (j.contains("hints") && j["hints"].value("requests", uint64_t{0}) > 0) {
      const auto& h = j["hints"];
      std::printf("hints %llu (%llu applied): %llu blocks prefetched, %llu displaced\n",
                  h["requests"].get<unsigned long long>(), h["applied"].get<unsigned long long>(),
                  h["prefetched"].get<unsigned long long>(),
                  h["displaced"].get<unsigned long long>());
    }
    std::fputs(SharesText(j).c_str(), stdout);
  } else if (what == "tiers") {
    for (const auto& t : j) {
      std::printf("%s\n", TierText(t).c_str());
      for (const auto& n : t["nodes"]) std::printf("  node %s\n", n.dump().c_str());
    }
  } else if (what == "clients") {
    std::printf("%6s %-16s %8s %6s %8s %8s %12s\n", "id", "name", "pid", "uid", "blocks", "slots",
                "observations");
    for (const auto& c : j) {
      std::printf("%6llu %-16s %8d %6u %8llu %8llu %12llu\n", c["id"].get<unsigned long long>(),
                  c["name"].get<std::string>().c_str(), c["pid"].get<int>(),
                  c["uid"].get<unsigned>(), c["blocks"].get<unsigned long long>(),
                  c["slots"].get<unsigned long long>(),
                  c["observations"].get<unsigned long long>());
    }
  } else {
    for (const char* side : {"hottest", "coldest"}) {
      std::printf("%s:\n", side);
      for (const auto& b : j[side]) {
        std::printf("  %s client %llu slot %llu score %.6g touches %llu tier %s\n",
                    b["key"].get<std::string>().c_str(), b["client"].get<unsigned long long>(),
                    b["slot"].get<unsigned long long>(), b["score"].get<double>(),
                    b["touches"].get<unsigned long long>(), b["tier"].get<std::string>().c_str());
      }
    }
  }
}

// A daemon that does not take the connection or answer (wedged) must not
// leave cxltierctl waiting without end: a liveness probe's process would
// stay until the pod's restart. Each request, from connect to the last byte
// of its answer however many reads that takes, ends at --timeout: an
// interval timer whose signal prints why and exits 1.
struct DaemonSocket {
  std::string path;
  double timeout_s = 30;  // 0: none
};

char g_deadline_message[256];
size_t g_deadline_length = 0;

extern "C" void DeadlineExpired(int) {
  // Async-signal-safe: write(2) and _exit(2) only.
  (void)!write(STDERR_FILENO, g_deadline_message, g_deadline_length);
  _exit(1);
}

// Armed for one request while it lives. `after`: what the message adds,
// for a request that asks for a change the daemon may still make.
class RequestDeadline {
 public:
  RequestDeadline(const DaemonSocket& socket, const char* what, const char* after = "") {
    if (socket.timeout_s <= 0) return;
    const int n =
        std::snprintf(g_deadline_message, sizeof(g_deadline_message),
                      "cxltierctl %s: cxltierd did not answer within %g s (--timeout)%s\n", what,
                      socket.timeout_s, after);
    g_deadline_length = std::min(sizeof(g_deadline_message) - 1, static_cast<size_t>(n));
    struct sigaction sa {};
    sa.sa_handler = DeadlineExpired;
    sigaction(SIGALRM, &sa, nullptr);
    const auto us = static_cast<long long>(std::ceil(socket.timeout_s * 1e6));
    itimerval timer{};
    timer.it_value.tv_sec = static_cast<time_t>(us / 1000000);
    timer.it_value.tv_usec = static_cast<suseconds_t>(us % 1000000);
    if (setitimer(ITIMER_REAL, &timer, nullptr) != 0) {
      // Never a request without its limit, silently.
      std::fprintf(stderr, "cxltierctl %s: cannot arm --timeout %g: %s\n", what, socket.timeout_s,
                   std::strerror(errno));
      std::exit(2);
    }
    armed_ = true;
  }
  ~RequestDeadline() {
    if (!armed_) return;
    const itimerval off{};
    setitimer(ITIMER_REAL, &off, nullptr);
  }
  RequestDeadline(const RequestDeadline&) = delete;
  RequestDeadline& operator=(const RequestDeadline&) = delete;

 private:
  bool armed_ = false;
};

int RunStats(const DaemonSocket& socket, const std::string& what, bool json) {
  std::string text;
  cxltier::Status st;
  {
    const RequestDeadline deadline(socket, what.c_str());
    st = cxltier::Client::DaemonStats(socket.path, what, &text);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "cxltierctl %s: %s\n", what.c_str(), st.message.c_str());
    return 1;
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) {
    std::fprintf(stderr, "cxltierctl %s: the daemon sent bad JSON\n", what.c_str());
    return 1;
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
  } else {
    PrintReadable(what, j);
  }
  return 0;
}

// A live view: tiers, hit rate, migration rate and the hottest blocks,
// redrawn every `interval` seconds (`iterations` 0: until interrupted).
int RunTop(const DaemonSocket& socket, double interval, int iterations, bool json) {
  nlohmann::json prev;
  auto prev_time = std::chrono::steady_clock::now();
  for (int i = 0; iterations == 0 || i < iterations; ++i) {
    std::string status_text, blocks_text;
    cxltier::Status st;
    {
      const RequestDeadline deadline(socket, "top");
      st = cxltier::Client::DaemonStats(socket.path, "status", &status_text);
    }
    if (st.ok()) {
      const RequestDeadline deadline(socket, "top");
      st = cxltier::Client::DaemonStats(socket.path, "blocks", &blocks_text);
    }
    if (!st.ok()) {
      std::fprintf(stderr, "cxltierctl top: %s\n", st.message.c_str());
      return 1;
    }
    const nlohmann::json s = nlohmann::json::parse(status_text, nullptr, false);
    const nlohmann::json b = nlohmann::json::parse(blocks_text, nullptr, false);
    if (s.is_discarded() || b.is_discarded()) {
      std::fprintf(stderr, "cxltierctl top: the daemon sent bad JSON\n");
      return 1;
    }
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - prev_time).count();
    auto rate = [&](const char* k) {
      if (!prev.is_object() || dt <= 0) return 0.0;
      return static_cast<double>(s["migrations"][k].get<uint64_t>() -
                                 prev["migrations"][k].get<uint64_t>()) /
             dt;
    };
    auto touch_rate = [&](const char* k) {
      if (!prev.is_object() || dt <= 0) return 0.0;
      return static_cast<double>(s[k].get<uint64_t>() - prev[k].get<uint64_t>()) / dt;
    };
    const double touches = touch_rate("touches"), hits = touch_rate("hits");
    if (json) {
      std::cout << nlohmann::json{{"status", s},
                                  {"hottest", b["hottest"]},
                                  {"promoted_bytes_per_s", rate("promoted_bytes")},
                                  {"demoted_bytes_per_s", rate("demoted_bytes")},
                                  {"touches_per_s", touches},
                                  {"hit_rate_now", touches > 0 ? hits / touches : 0.0}}
                       .dump()
                << "\n"
                << std::flush;
    } else {
      std::printf("\033[H\033[2J");  // home, clear
      std::printf("cxltierd  %llu clients  %llu blocks  %llu ghosts  policy %s  tick %llu ms\n",
                  s["clients"].get<unsigned long long>(), s["blocks"].get<unsigned long long>(),
                  s["ghosts"].get<unsigned long long>(), s["policy"].get<std::string>().c_str(),
                  s["tick_ms"].get<unsigned long long>());
      for (const auto& t : s["tiers"]) std::printf("%s\n", TierText(t).c_str());
      std::printf("hit rate %.1f%% now (%.0f touches/s), %.1f%% since start\n",
                  touches > 0 ? 100.0 * hits / touches : 0.0, touches,
                  100.0 * s["hit_rate"].get<double>());
      std::printf("migration: %s/s promoted, %s/s demoted, %llu pending, %llu failed\n",
                  cxltier::FormatBytes(static_cast<uint64_t>(rate("promoted_bytes"))).c_str(),
                  cxltier::FormatBytes(static_cast<uint64_t>(rate("demoted_bytes"))).c_str(),
                  s["migrations"]["pending"].get<unsigned long long>(),
                  s["migrations"]["failed"].get<unsigned long long>());
      std::fputs(SharesText(s).c_str(), stdout);
      std::printf("tick p50 %.0f us, p99 %.0f us\n\n%-34s %8s %10s %8s %5s\n",
                  s["tick_seconds"]["p50"].get<double>() * 1e6,
                  s["tick_seconds"]["p99"].get<double>() * 1e6, "hottest blocks", "client", "score",
                  "touches", "tier");
      int n = 0;
      for (const auto& h : b["hottest"]) {
        if (n++ == 10) break;
        std::printf("%-34s %8llu %10.4g %8llu %5s\n", h["key"].get<std::string>().c_str(),
                    h["client"].get<unsigned long long>(), h["score"].get<double>(),
                    h["touches"].get<unsigned long long>(), h["tier"].get<std::string>().c_str());
      }
      std::fflush(stdout);
    }
    prev = s;
    prev_time = now;
    if (iterations == 0 || i + 1 < iterations) {
      std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    }
  }
  return 0;
}

// `quota`: every user's share and quota (one's own only, for a peer that is
// neither root nor in the admin group).
int RunQuotaShow(const DaemonSocket& socket, bool json) {
  std::string text;
  cxltier::Status st;
  {
    const RequestDeadline deadline(socket, "quota");
    st = cxltier::Client::DaemonStats(socket.path, "status", &text);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "cxltierctl quota: %s\n", st.message.c_str());
    return 1;
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.contains("quotas")) {
    std::fprintf(stderr, "cxltierctl quota: the daemon sent bad JSON (or has no quotas)\n");
    return 1;
  }
  if (json) {
    std::cout << j["quotas"].dump(2) << "\n";
    return 0;
  }
  const std::string shares = SharesText(j);
  std::fputs(shares.empty() ? "no user holds blocks and no quota is set\n" : shares.c_str(),
             stdout);
  return 0;
}

int RunAdmin(const DaemonSocket& socket, cxltier::wire::AdminOp op, const std::string& arg,
             const char* what, bool json) {
  std::string text;
  cxltier::Status st;
  {
    const RequestDeadline deadline(
        socket, what,
        op == cxltier::wire::AdminOp::kShowConfig ? "" : "; the daemon may still make the change");
    st = cxltier::Client::DaemonAdmin(socket.path, op, arg, &text);
  }
  if (!st.ok()) {
    std::fprintf(stderr, "cxltierctl %s: %s\n", what, st.message.c_str());
    return 1;
  }
  if (json) {
    std::cout << nlohmann::json{{"ok", true}, {"result", text}}.dump(2) << "\n";
  } else {
    std::fputs(text.c_str(), stdout);
    if (!text.empty() && text.back() != '\n') std::fputc('\n', stdout);
  }
  return 0;
}

std::atomic<bool> g_interrupted{false};

// The replay of a recording with the settings the daemon ran with.
// `s` quoted for a POSIX shell when it needs it.
std::string ShellQuoted(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789/._-+:=,") == std::string::npos) {
    return s;
  }
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string ReplayCommand(const nlohmann::json& s, const std::string& out) {
  const auto num = [&](const char* k) { return s.value(k, nlohmann::json(0)).dump(); };
  // Two tiers: --budget (tier 0's); more: --tiers with every budgeted tier's.
  std::string budgets = " --budget " + num("tier0_budget_bytes");
  if (const auto lower = s.find("lower_tier_budget_bytes");
      lower != s.end() && lower->is_array() && !lower->empty()) {
    budgets = " --tiers " + num("tier0_budget_bytes");
    for (const nlohmann::json& b : *lower) budgets += "," + b.dump();
  }
  return "cxltier-sim --trace " + ShellQuoted("bin:" + out) +
         " --mode tick --tick-steps 1 --block-bytes " + num("block_bytes") + budgets +
         " --migrate-per-tick " + num("migrate_bytes_per_tick") + " --hysteresis " +
         num("hysteresis_ticks") + " --landing " + num("landing_percent") + " --ghosts " +
         num("ghost_capacity") + " --persist " + (s.value("persist", true) ? "persist" : "reset") +
         " --policy " + ShellQuoted(s.value("policy", std::string("default")));
}

// record: start, wait (Ctrl-C ends it early), stop, and copy the trace the
// daemon passes back into `out` (0600: the traffic of every user of the host).
int RunRecord(const DaemonSocket& socket, uint64_t seconds, uint64_t max_events,
              const std::string& out, bool json) {
  std::string text;
  std::string arg = std::to_string(seconds);
  if (max_events) arg += ":" + std::to_string(max_events);
  using cxltier::wire::AdminOp;
  cxltier::Status started;
  {
    // The message says what a start made after all would hold up.
    const std::string after = "; the daemon may still start a recording of " +
                              std::to_string(seconds) +
                              " s, and another record is refused (busy) until it ends";
    const RequestDeadline deadline(socket, "record", after.c_str());
    started = cxltier::Client::DaemonAdmin(socket.path, AdminOp::kRecordStart, arg, &text);
  }
  if (const cxltier::Status& st = started; !st.ok()) {
    std::fprintf(stderr, "cxltierctl record: %s\n", st.message.c_str());
    return 1;
  }
  // A new file beside the output (mkstemp: 0600, never an existing file or a
  // symlink), renamed over it at the end; made before waiting, so a bad path
  // fails now, not after the wait.
  std::string tmp = out + ".XXXXXX";
  const int out_fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (out_fd < 0) {
    std::fprintf(stderr, "cxltierctl record: %s: %s\n", out.c_str(), std::strerror(errno));
    // Only to end the recording: its trace is not wanted, so a limit costs nothing.
    const RequestDeadline deadline(socket, "record (ending it)");
    (void)cxltier::Client::DaemonAdmin(socket.path, AdminOp::kRecordStop, "", &text);
    return 1;
  }
  if (!json)
    std::fprintf(stderr, "recording for %llu s (Ctrl-C stops early)\n",
                 static_cast<unsigned long long>(seconds));
  // Ctrl-C, a terminal hang-up or a kill end the wait early; the recording is
  // still taken and saved.
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, [](int) { g_interrupted = true; });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (!g_interrupted && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, SIG_DFL);
  // No deadline for the stop: the daemon writes the whole trace (up to 256
  // MiB) before it answers, and a stop given up on would lose it.
  int trace_fd = -1;
  if (cxltier::Status st =
          cxltier::Client::DaemonAdmin(socket.path, AdminOp::kRecordStop, "", &text, &trace_fd);
      !st.ok() || trace_fd < 0) {
    std::fprintf(stderr, "cxltierctl record: %s\n",
                 st.ok() ? "the daemon passed no trace back" : st.message.c_str());
    close(out_fd);
    unlink(tmp.c_str());
    return 1;
  }
  struct stat sb {};
  bool ok = fstat(trace_fd, &sb) == 0;
  off_t off = 0;
  while (ok && off < sb.st_size) {
    const ssize_t n = sendfile(out_fd, trace_fd, &off, static_cast<size_t>(sb.st_size - off));
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
  }
  int copy_errno = ok ? 0 : errno;
  close(trace_fd);
  if (close(out_fd) != 0 && ok) {
    ok = false;
    copy_errno = errno;
  }
  if (ok && rename(tmp.c_str(), out.c_str()) != 0) {
    ok = false;
    copy_errno = errno;
  }
  if (!ok) {
    std::fprintf(stderr, "cxltierctl record: writing %s: %s\n", out.c_str(),
                 copy_errno ? std::strerror(copy_errno) : "short copy");
    unlink(tmp.c_str());
    return 1;
  }
  nlohmann::json s = nlohmann::json::parse(text, nullptr, false);
  if (s.is_discarded()) s = nlohmann::json::object();
  s["file"] = out;
  s["bytes"] = static_cast<uint64_t>(sb.st_size);
  s["replay"] = ReplayCommand(s, out);
  // The daemon's moves are in the trace: the same replay with them, when it
  // had them. Not for a trace that lost a uid's events past its share: that
  // is a what-if trace only.
  if (s.value("recorded_moves", false) && s.value("exact", true))
    s["replay_exact"] = s["replay"].get<std::string>() + " --moves recorded";
  if (json) {
    std::cout << s.dump(2) << "\n";
    return 0;
  }
  std::printf("recorded %s ticks (%s ms each): %s events on %s blocks into %s (%llu bytes)%s\n",
              s.value("ticks", nlohmann::json(0)).dump().c_str(),
              s.value("tick_ms", nlohmann::json(0)).dump().c_str(),
              s.value("events", nlohmann::json(0)).dump().c_str(),
              s.value("keys", nlohmann::json(0)).dump().c_str(), out.c_str(),
              static_cast<unsigned long long>(sb.st_size),
              s.value("truncated", false) ? ", truncated at the event or memory cap" : "");
  if (s.value("hints", uint64_t{0}) > 0) {
    std::printf("hints: %s on %s groups\n", s["hints"].dump().c_str(),
                s.value("groups", nlohmann::json(0)).dump().c_str());
  }
  if (const auto d = s.find("dropped"); d != s.end() && d->is_object() && !d->empty()) {
    std::string who;
    for (const auto& [uid, n] : d->items()) who += " uid " + uid + ": " + n.dump() + ";";
    who.pop_back();
    std::printf(
        "dropped past their uid's share of the budget (each uid's events stop at its "
        "first loss):%s; no exact replay\n",
        who.c_str());
  }
  std::printf("live: %s touches, hit rate %.2f%% (policy %s)\n",
              s.value("touches", nlohmann::json(0)).dump().c_str(), 100 * s.value("hit_rate", 0.0),
              s.value("policy", std::string("?")).c_str());
  std::printf("replay with the daemon's settings (change --policy to compare):\n  %s\n",
              s["replay"].get<std::string>().c_str());
  if (s.contains("replay_exact")) {
    std::printf(
        "replay exactly as the daemon ran it, its plans and moves when it had them (its policy "
        "only):\n  %s\n",
        s["replay_exact"].get<std::string>().c_str());
    // TinyLFU's sketch indexes keys by their hash, and the recording's keys
    // are hashed again (operations.md, "record and replay").
    const std::string policy = s.value("policy", std::string());
    // shards samples keys by their hash too (policies.md, "shards").
    if (policy == "default" || policy == "adaptive" || policy.starts_with("shards") ||
        policy.find("tinylfu") != std::string::npos) {
      std::printf(
          "  (policy %s counts touches in a tinylfu sketch indexed by key hashes, and the "
          "recording's keys are hashed again: the exact replay may part from the daemon; it "
          "then says where and stops)\n",
          policy.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxltierctl: plan and operate cxltier"};
  app.require_subcommand(1);

  PlanFlags plan;
  CLI::App* plan_cmd =
      app.add_subcommand("plan", "KV-cache and block-state sizes for a model and context");
  plan_cmd->add_option("--model", plan.model, "model preset")->capture_default_str();
  plan_cmd->add_option("--context", plan.context, "context tokens (131072, 128k, 1M)")
      ->capture_default_str();
  plan_cmd->add_flag("--json", plan.json, "print one JSON object");
  plan_cmd->add_flag("--per-layer", plan.per_layer,
                     "per-layer KV bytes at the context for every preset");
  plan_cmd->add_option("--layers", plan.layers, "override: transformer layers");
  plan_cmd->add_option("--query-heads", plan.query_heads, "override: query heads");
  plan_cmd->add_option("--kv-heads", plan.kv_heads, "override: KV heads");
  plan_cmd->add_option("--head-dim", plan.head_dim, "override: head dimension");
  plan_cmd->add_option("--dtype-bytes", plan.dtype_bytes, "override: bytes per element");
  plan_cmd->add_option("--block-tokens", plan.block_tokens, "override: tokens per block");

  DaemonSocket socket{cxltier::DefaultSocketPath()};
  bool json = false;
  app.add_option("--socket", socket.path, "cxltierd's socket")->capture_default_str();
  app.add_option("--timeout", socket.timeout_s,
                 "seconds a request may take, from connect to answer, before cxltierctl gives "
                 "up with exit 1 (0: no limit; record's stop has none)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0))
      ->check(CLI::Validator(
          [](const std::string& text) {
            // Range lets NaN through: it compares false both ways.
            return std::isfinite(std::strtod(text.c_str(), nullptr)) ? std::string()
                                                                     : "not a number of seconds";
          },
          "finite"));
  std::vector<std::pair<CLI::App*, std::string>> stats_cmds;
  for (const char* what : {"status", "tiers", "clients", "blocks"}) {
    CLI::App* cmd = app.add_subcommand(what, std::string("the daemon's ") + what);
    cmd->add_flag("--json", json, "print JSON");
    stats_cmds.push_back({cmd, what});
  }
  double top_interval = 1.0;
  int top_iterations = 0;
  CLI::App* top_cmd =
      app.add_subcommand("top", "a live view of tiers, hit rate, migration, hot blocks");
  top_cmd->add_option("--interval", top_interval, "seconds between refreshes")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  top_cmd->add_option("--iterations", top_iterations, "refreshes, then exit (0: until Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  top_cmd->add_flag("--json", json, "one JSON object per refresh");
  // Operator commands: reload and policy set need root or the admin group.
  CLI::App* reload_cmd = app.add_subcommand("reload", "re-read the daemon's configuration file");
  reload_cmd->add_flag("--json", json, "print JSON");
  CLI::App* policy_cmd = app.add_subcommand("policy", "the placement policy");
  policy_cmd->require_subcommand(1);
  std::string policy;
  CLI::App* policy_set = policy_cmd->add_subcommand("set", "switch the running daemon's policy");
  policy_set->add_option("name", policy, "lru, lfu, ema:<alpha>, arc, s3fifo, sieve, tinylfu")
      ->required();
  policy_set->add_flag("--json", json, "print JSON");
  CLI::App* quota_cmd = app.add_subcommand(
      "quota", "every user's share of the tiers and its quota (set: root or the admin group)");
  quota_cmd->add_flag("--json", json, "print JSON");
  std::vector<std::string> quota_words;
  CLI::App* quota_set = quota_cmd->add_subcommand(
      "set",
      "set a quota until the next reload: uid=N|user=NAME (with client=NAME: that user's "
      "connections of that name), then tier0=SIZE, tierK=SIZE, tiers=SIZE,SIZE,..., "
      "guarantee=SIZE (users), or none to remove it");
  quota_set->add_option("words", quota_words, "e.g. uid=1001 tier0=8GiB guarantee=4GiB")
      ->required();
  quota_set->add_flag("--json", json, "print JSON");
  CLI::App* config_cmd = app.add_subcommand("config", "the daemon's configuration");
  config_cmd->require_subcommand(1);
  CLI::App* config_show =
      config_cmd->add_subcommand("show", "print the effective configuration (TOML)");
  config_show->add_flag("--json", json, "print JSON");
  uint64_t record_seconds = 0, record_max_events = 0;
  std::string record_out;
  CLI::App* record_cmd = app.add_subcommand(
      "record", "record the daemon's traffic as a trace for cxltier-sim (root or the admin group)");
  record_cmd->add_option("--seconds", record_seconds, "how long")
      ->required()
      ->check(CLI::Range(uint64_t{1}, uint64_t{86400}));
  record_cmd->add_option("--out", record_out, "the trace file (binary, docs/workloads.md)")
      ->required();
  record_cmd->add_option("--max-events", record_max_events,
                         "stop at this many events (default and at most 16M)");
  record_cmd->add_flag("--json", json, "print JSON");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (plan_cmd->parsed()) return RunPlan(plan);
  if (top_cmd->parsed()) return RunTop(socket, top_interval, top_iterations, json);
  using cxltier::wire::AdminOp;
  if (reload_cmd->parsed()) return RunAdmin(socket, AdminOp::kReload, "", "reload", json);
  if (record_cmd->parsed()) {
    return RunRecord(socket, record_seconds, record_max_events, record_out, json);
  }
  if (policy_set->parsed())
    return RunAdmin(socket, AdminOp::kSetPolicy, policy, "policy set", json);
  if (config_show->parsed()) return RunAdmin(socket, AdminOp::kShowConfig, "", "config show", json);
  if (quota_set->parsed()) {
    std::string arg;
    for (const std::string& w : quota_words) arg += (arg.empty() ? "" : " ") + w;
    return RunAdmin(socket, AdminOp::kSetQuota, arg, "quota set", json);
  }
  if (quota_cmd->parsed()) return RunQuotaShow(socket, json);
  for (const auto& [cmd, what] : stats_cmds) {
    if (cmd->parsed()) return RunStats(socket, what, json);
  }
  return 2;
}
