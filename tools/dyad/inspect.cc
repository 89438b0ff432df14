#include "inspect.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "commands.h"
#include "common/format.h"
#include "common/time.h"
#include "service/stats.h"

namespace dyad {
namespace cli {
namespace {

using Json = nlohmann::ordered_json;

// "3 s ago", "-" when never.
std::string Ago(uint64_t wall_ns) {
  if (wall_ns == 0) return "never";
  const uint64_t now = WallNs();
  const uint64_t s = now > wall_ns ? (now - wall_ns) / 1000000000ull : 0;
  return std::to_string(s) + " s ago";
}

std::string FormatRate(uint64_t bytes, uint64_t ns) {
  if (ns == 0) return "-";
  return HumanBytes(
             static_cast<uint64_t>(static_cast<double>(bytes) * 1e9 / static_cast<double>(ns))) +
         "/s";
}

namespace dc = ::dyad::client;

// A client configured from the environment.
dc::Status EnvClient(dc::Client* out) {
  dc::Options o;
  dc::Status st = dc::Options::FromEnv(&o);
  return st.ok() ? dc::Client::Create(o, out) : st;
}

// --- Prometheus ---------------------------------------------------------

std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

struct Family {
  std::string help, type;
  std::vector<std::pair<std::string, std::string>> samples;  // labels, value
};

}  // namespace

std::string PrometheusText(const dc::ServiceStatus& st) {
  auto info = [&](const char* k) {
    auto it = st.info.find(k);
    return it == st.info.end() ? std::string() : it->second;
  };
  const std::string rank = "rank=\"" + LabelValue(info("rank")) + "\"";
  std::map<std::string, Family> families;  // by metric name; sorted output
  for (const auto& [name, value] : st.counters) {
    std::string transport;
    const MetricRow* row = ServiceStats::FindMetric(name, &transport);
    if (row == nullptr) {
      // A service newer than this tool: exported, but without a kind.
      std::string metric = "dyad_";
      for (char c : name) metric += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
      Family& f = families[metric];
      f.help = "DYAD metric " + name + " (not in this dyad tool's metric table).";
      f.type = "untyped";
      f.samples.emplace_back(rank, std::to_string(value));
      continue;
    }
    const bool counter = row->type == MetricType::kCounter;
    Family& f = families[std::string("dyad_") + row->prometheus + (counter ? "_total" : "")];
    f.help = row->help;
    f.type = counter ? "counter" : "gauge";
    f.samples.emplace_back(
        transport.empty() ? rank : rank + ",transport=\"" + LabelValue(transport) + "\"",
        std::to_string(value));
  }
  Family& idf = families["dyad_info"];
  idf.help = "Identity of the dyad-service (value 1).";
  idf.type = "gauge";
  idf.samples.emplace_back(rank + ",version=\"" + LabelValue(info("version")) + "\",host=\"" +
                               LabelValue(info("host")) + "\",address=\"" +
                               LabelValue(info("address")) + "\",transport=\"" +
                               LabelValue(info("transport")) + "\"",
                           "1");
  Family& up = families["dyad_uptime_seconds"];
  up.help = "Seconds since the dyad-service started.";
  up.type = "gauge";
  up.samples.emplace_back(rank, info("uptime_s").empty() ? "0" : info("uptime_s"));
  size_t in = 0, out = 0;
  for (const dc::Transfer& t : st.transfers) (t.outgoing ? out : in)++;
  Family& fl = families["dyad_transfers_in_flight"];
  fl.help = "Transfers in progress, by direction.";
  fl.type = "gauge";
  fl.samples.emplace_back(rank + ",direction=\"in\"", std::to_string(in));
  fl.samples.emplace_back(rank + ",direction=\"out\"", std::to_string(out));

  std::string text;
  for (const auto& [metric, f] : families) {
    text += "# HELP " + metric + " " + f.help + "\n# TYPE " + metric + " " + f.type + "\n";
    for (const auto& [labels, value] : f.samples)
      text += metric + "{" + labels + "} " + value + "\n";
  }
  return text;
}

std::string TransfersTable(const std::vector<dc::Transfer>& transfers) {
  if (transfers.empty()) return "";
  std::ostringstream os;
  char line[512];
  std::snprintf(line, sizeof line, "  %-4s %-5s %-9s %-24s %-12s %s\n", "DIR", "PEER", "TRANSPORT",
                "DONE / TOTAL", "RATE", "PATH");
  os << "\ntransfers in flight:\n" << line;
  for (const dc::Transfer& t : transfers) {
    const bool known = t.bytes_done != dc::Transfer::kUnknownBytes;
    const std::string done =
        (known ? HumanBytes(t.bytes_done) : std::string("?")) + " / " + HumanBytes(t.bytes_total);
    std::snprintf(line, sizeof line, "  %-4s %-5u %-9s %-24s %-12s %s\n", t.outgoing ? "out" : "in",
                  t.peer_rank, t.transport.c_str(), done.c_str(),
                  known ? FormatRate(t.bytes_done, t.elapsed_ns).c_str() : "-", t.path.c_str());
    os << line;
  }
  return os.str();
}

bool OwnerStates(dc::Client& client, const std::vector<uint32_t>& ranks,
                 std::map<uint32_t, dc::PeerState>* states) {
  states->clear();
  if (ranks.empty()) return true;
  std::vector<dc::Peer> peers;
  if (!client.Peers(ranks, 1000, &peers).ok()) return false;
  for (const dc::Peer& p : peers) (*states)[p.rank] = p.state;
  return true;
}

int CmdPeers(double timeout_s, bool json) {
  dc::Client client;
  dc::Status st = EnvClient(&client);
  std::vector<dc::Peer> peers;
  if (st.ok()) st = client.Peers({}, static_cast<int64_t>(timeout_s * 1000), &peers);
  if (!st.ok()) {
    std::cerr << "dyad peers: " << st.ToString() << "\n";
    return kExitFailed;
  }
  if (json) {
    Json arr = Json::array();
    for (const dc::Peer& p : peers) {
      Json j;
      j["rank"] = p.rank;
      j["node"] = p.node;
      j["address"] = p.address;
      j["host"] = p.host;
      j["pid"] = p.pid;
      j["incarnation"] = Hex64(p.incarnation);
      j["started_ns"] = p.started_ns;
      j["state"] = dc::PeerStateName(p.state);
      j["last_contact_ns"] = p.last_contact_ns;
      j["rtt_us"] = p.rtt_ns / 1000;
      j["detail"] = p.detail;
      arr.push_back(std::move(j));
    }
    std::cout << arr.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%-5s %-7s %-22s %-16s %-8s %-16s %-19s %-13s %s\n", "RANK", "STATE", "ADDRESS",
              "HOST", "PID", "INCARNATION", "STARTED", "LAST CONTACT", "RTT / DETAIL");
  for (const dc::Peer& p : peers) {
    std::string tail = p.detail;
    if (p.state == dc::PeerState::kAlive && p.rtt_ns != 0) {
      char rtt[32];
      std::snprintf(rtt, sizeof rtt, "%.2f ms", static_cast<double>(p.rtt_ns) / 1e6);
      tail = rtt;
    }
    std::printf("%-5u %-7s %-22s %-16s %-8s %-16s %-19s %-13s %s\n", p.rank,
                dc::PeerStateName(p.state), p.address.c_str(), p.host.c_str(),
                p.pid ? std::to_string(p.pid).c_str() : "-", Hex64(p.incarnation).c_str(),
                LocalDateTime(p.started_ns, "-").c_str(), Ago(p.last_contact_ns).c_str(),
                tail.c_str());
  }
  return kExitOk;
}

bool ProgressWanted() { return ::isatty(STDOUT_FILENO) && ::isatty(STDERR_FILENO); }

namespace {

size_t StderrWidth() {
  winsize ws{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40) return ws.ws_col;
  return 80;
}

// "name [#######.............]  35%  35.0 MiB / 100.0 MiB  97.2 MiB/s"
void DrawBar(const std::string& name, const dc::Transfer& t) {
  const size_t width = StderrWidth();
  const bool known = t.bytes_done != dc::Transfer::kUnknownBytes && t.bytes_total > 0;
  const double frac =
      known ? std::min(1.0, static_cast<double>(t.bytes_done) / static_cast<double>(t.bytes_total))
            : 0.0;
  char tail[128];
  std::snprintf(tail, sizeof tail, " %3d%%  %s / %s  %s", static_cast<int>(frac * 100),
                known ? HumanBytes(t.bytes_done).c_str() : "?", HumanBytes(t.bytes_total).c_str(),
                known ? FormatRate(t.bytes_done, t.elapsed_ns).c_str() : "");
  std::string label = name.size() > 30 ? "..." + name.substr(name.size() - 27) : name;
  const size_t fixed = label.size() + 3 + std::string(tail).size();
  const size_t bar = width > fixed + 10 ? std::min<size_t>(width - fixed - 1, 50) : 10;
  const size_t filled = static_cast<size_t>(frac * static_cast<double>(bar));
  std::string line = "\r" + label + " [" + std::string(filled, '#') +
                     std::string(bar - filled, '.') + "]" + tail + "\033[K";
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace

dc::Status ConsumeShowingProgress(dc::Client& client, const std::string& path,
                                  const std::string& upath, dc::ConsumeInfo* info) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  dc::Status result;
  std::thread consumer([&] {
    dc::Status r = client.Consume(path, info);
    std::lock_guard<std::mutex> lk(mu);
    result = std::move(r);
    done = true;
    cv.notify_all();
  });
  // The progress comes from the service's list of transfers in flight, on a
  // connection of its own.
  dc::Client watcher;
  const bool watching = EnvClient(&watcher).ok();
  bool drawn = false;
  std::unique_lock<std::mutex> lk(mu);
  while (!done) {
    cv.wait_for(lk, std::chrono::milliseconds(200));
    if (done || !watching) continue;
    lk.unlock();
    dc::ServiceStatus st;
    const bool got = watcher.GetServiceStatus(&st).ok();
    lk.lock();
    if (!got || done) continue;
    for (const dc::Transfer& t : st.transfers)
      if (!t.outgoing && t.path == upath) {
        DrawBar(upath, t);
        drawn = true;
      }
  }
  lk.unlock();
  consumer.join();
  if (drawn) std::fputs("\r\033[K", stderr);
  return result;
}

}  // namespace cli
}  // namespace dyad
