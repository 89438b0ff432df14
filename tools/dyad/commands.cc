#include "commands.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "client/client.h"
#include "common/backend.h"
#include "common/config.h"
#include "common/munge/munge.h"
#include "common/seal.h"
#include "common/time.h"
#include "dyad_version.h"
#include "inspect.h"
#include "kvs/kvs.h"
#include "transport/transport.h"

namespace dyad {
namespace cli {
namespace {

using Json = nlohmann::ordered_json;

// "dyad produce: a/b: DYAD_RC_NOSERVICE: dyad-service is not reachable ..."
void PrintError(const std::string& cmd, const std::string& what, const Status& st) {
  std::string line = "dyad " + cmd + ": ";
  if (!what.empty()) line += what + ": ";
  line += dyad_rc_name(st.code());
  if (!st.message().empty()) line += ": " + st.message();
  std::cerr << line << "\n";
}

// Greedy word wrap of `text` to `width` columns, each line after `indent`.
std::string Wrap(const std::string& text, size_t width, const std::string& indent) {
  std::istringstream words(text);
  std::string word, line, out;
  while (words >> word) {
    if (!line.empty() && indent.size() + line.size() + 1 + word.size() > width) {
      out += indent + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty()) out += indent + line + "\n";
  return out;
}

size_t TerminalWidth() {
  winsize ws{};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
    return std::min<size_t>(ws.ws_col, 100);
  return 80;
}

std::string Join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// Local time with milliseconds, e.g. "2024-05-01 12:00:00.123".
std::string FormatTimeNs(uint64_t ns) {
  if (ns == 0) return "-";
  const time_t secs = static_cast<time_t>(ns / 1000000000ull);
  tm t{};
  localtime_r(&secs, &t);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &t);
  char ms[8];
  std::snprintf(ms, sizeof ms, ".%03u", static_cast<unsigned>((ns / 1000000ull) % 1000));
  return std::string(buf) + ms;
}

std::string FormatMs(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  return buf;
}

// A client configured from the environment, for the query commands (they
// need no managed directory).
Result<std::shared_ptr<Client>> EnvClient() {
  Result<ClientConfig> cfg = ClientConfig::FromEnv();
  if (!cfg.ok()) return cfg.status();
  return Client::Create(std::move(*cfg));
}

// A client from the environment for produce or consume, which needs the
// `side` managed directory. Reports problems itself. The command uses the
// client core directly (statically linked), not the C context: it needs
// what the service says about peers and transfers, which the public API
// does not carry.
std::shared_ptr<Client> InitFromEnv(const std::string& cmd, Side side) {
  Result<ClientConfig> cfg = ClientConfig::FromEnv();
  if (!cfg.ok()) {
    PrintError(cmd, "", cfg.status());
    return nullptr;
  }
  const bool producer = side == Side::kProducer;
  if ((producer ? cfg->prod_managed_path : cfg->cons_managed_path).empty()) {
    PrintError(cmd, "",
               Status(DYAD_RC_BADMANAGEDPATH,
                      std::string("no ") + (producer ? "producer" : "consumer") +
                          "-managed directory: set " +
                          (producer ? "DYAD_PATH_PRODUCER" : "DYAD_PATH_CONSUMER")));
    return nullptr;
  }
  Result<std::shared_ptr<Client>> client = Client::Create(std::move(*cfg));
  if (!client.ok()) {
    PrintError(cmd, "", client.status());
    return nullptr;
  }
  return *client;
}

// What each compiled-in transport would use on this host (Transport::Probe),
// by name; transports with nothing to say are left out.
std::map<std::string, std::string> TransportProbes(const std::vector<std::string>& names) {
  std::map<std::string, std::string> out;
  for (const std::string& name : names) {
    Result<std::unique_ptr<Transport>> t = CreateTransport(name, TransportOptions());
    if (!t.ok()) continue;
    std::string probe = (*t)->Probe();
    if (!probe.empty()) out[name] = std::move(probe);
  }
  return out;
}

}  // namespace

namespace {

// The link protection a service started from this environment would use.
std::string ConfiguredProtection() {
  const std::string text = GetEnv("DYAD_LINK_PROTECTION").value_or("integrity");
  Result<LinkProtection> p = ParseLinkProtection(text.empty() ? "integrity" : text);
  if (!p.ok()) return "invalid: " + p.status().message();
  return LinkProtectionDescription(*p);
}

// "rank 0 (10.0.0.1:7590) over tcp": who served a consume and how.
std::string Served(const ConsumeReply& r) {
  std::string s = "rank " + std::to_string(r.record.owner_rank);
  if (!r.owner_address.empty()) s += " (" + r.owner_address + ")";
  if (!r.transport.empty()) s += " over " + r.transport;
  return s;
}

}  // namespace

int CmdInfo(InfoFormat format) {
  const std::vector<std::string> transports = TransportNames();
  const std::vector<std::string> stores = KvsBackendNames();
  const auto& table = ConfigTable();

  if (format == InfoFormat::kJson) {
    Json j;
    j["version"] = DYAD_VERSION;
    j["build"] = DYAD_VERSION_FULL;
    j["transports"] = transports;
    j["transport_details"] = TransportProbes(transports);
    j["kvs_backends"] = stores;
    Json rows = Json::array();
    for (const BackendRow* row : BackendRows()) {
      Json r;
      r["kind"] = row->kind == BackendKind::kTransport ? "transport" : "store";
      r["name"] = row->name;
      r["selectors"] = std::vector<std::string>(row->selectors.begin(), row->selectors.end());
      r["aliases"] = std::vector<std::string>(row->aliases.begin(), row->aliases.end());
      r["capabilities"] = CapsText(*row);
      r["built"] = row->built;
      r["build_switch"] = row->build_switch;
      r["summary"] = row->summary;
      rows.push_back(std::move(r));
    }
    j["backends"] = std::move(rows);
    j["service_socket"] = DefaultServiceSocket();
    j["link_protection"] = ConfiguredProtection();
    j["munge"] = MungeCompiledIn();
    Json cfg = Json::array();
    for (const ConfigEntry& e : table) {
      Json item;
      item["name"] = e.name;
      item["kind"] = ConfigKindName(e.kind);
      item["default"] = e.default_value;
      std::optional<std::string> cur = GetEnv(e.name);
      item["current"] = cur ? Json(*cur) : Json(nullptr);
      item["used_by"] = e.used_by;
      item["help"] = e.help;
      cfg.push_back(std::move(item));
    }
    j["config"] = std::move(cfg);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }

  if (format == InfoFormat::kMarkdown) {
    // The tables of docs/configuration.md, generated from the same source.
    std::cout << BackendTableMarkdown(BackendKind::kTransport) << "\n"
              << BackendTableMarkdown(BackendKind::kStore) << "\n"
              << "| variable | type | default | used by | meaning |\n"
              << "| --- | --- | --- | --- | --- |\n";
    for (const ConfigEntry& e : table) {
      std::string def = *e.default_value ? std::string("`") + e.default_value + "`" : "(unset)";
      std::cout << "| `" << e.name << "` | " << ConfigKindName(e.kind) << " | " << def << " | "
                << e.used_by << " | " << e.help << " |\n";
    }
    return kExitOk;
  }

  const size_t width = TerminalWidth();
  std::cout << "dyad " << DYAD_VERSION_FULL << "\n"
            << "transports:      " << Join(transports, ", ") << "\n";
  for (const auto& [name, probe] : TransportProbes(transports))
    std::cout << Wrap(name + ": " + probe, width, "                 ");
  std::cout << "metadata stores: " << Join(stores, ", ") << "\n"
            << "service socket:  " << DefaultServiceSocket() << "\n"
            << "MUNGE:           " << (MungeCompiledIn() ? "available" : "not compiled in") << "\n"
            << "link protection (services, DYAD_LINK_PROTECTION):\n"
            << Wrap(ConfiguredProtection(), width, "    ") << "\n"
            << "Configuration (environment variables; booleans are true when set, except "
               "0/false/no/off):\n\n";
  for (const BackendRow* row : BackendRows()) {
    const bool t = row->kind == BackendKind::kTransport;
    std::string sel;
    for (const char* x : row->selectors) sel += (sel.empty() ? "" : ", ") + std::string(x);
    for (const char* x : row->aliases) sel += ", " + std::string(x) + " (alias)";
    std::cout << (t ? "transport " : "store     ") << row->name << " ["
              << (row->built ? "built" : "not built: " + std::string(row->build_switch) + "=OFF or " +
                                             row->needs + " missing")
              << "]\n    " << (t ? "DTL modes: " : "URL forms: ") << sel
              << "   capabilities: " << CapsText(*row) << "\n"
              << Wrap(row->summary, width, "    ") << "\n";
  }
  std::cout << "\n";
  for (const ConfigEntry& e : table) {
    std::optional<std::string> cur = GetEnv(e.name);
    std::cout << e.name << "\n"
              << "    current: " << (cur ? "'" + *cur + "'" : std::string("(unset)"))
              << "   default: " << (*e.default_value ? e.default_value : "(unset)")
              << "   type: " << ConfigKindName(e.kind) << "   used by: " << e.used_by << "\n"
              << Wrap(e.help, width, "    ") << "\n";
  }
  return kExitOk;
}

int CmdProduce(const std::vector<std::string>& paths, bool verbose) {
  std::shared_ptr<Client> client = InitFromEnv("produce", Side::kProducer);
  if (client == nullptr) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    // The C API ignores paths outside the managed directory (upstream);
    // here a user named the file, so say why nothing happened.
    Result<std::string> upath = client->Resolve(path, Side::kProducer);
    if (!upath.ok()) {
      PrintError("produce", path, upath.status());
      failed = true;
      continue;
    }
    const uint64_t t0 = MonoNs();
    const Status st = client->Produce(path);
    const uint64_t dt = MonoNs() - t0;
    if (!st.ok()) {
      PrintError("produce", path, st);
      failed = true;
      continue;
    }
    if (verbose) std::cout << path << ": published '" << *upath << "' in " << FormatMs(dt) << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdConsume(const std::vector<std::string>& paths, double timeout_s, bool verbose,
               bool progress) {
  if (timeout_s >= 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", timeout_s);
    ::setenv("DYAD_CONSUME_TIMEOUT", buf, 1);
  }
  std::shared_ptr<Client> client = InitFromEnv("consume", Side::kConsumer);
  if (client == nullptr) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    Result<std::string> upath = client->Resolve(path, Side::kConsumer);
    if (!upath.ok()) {
      PrintError("consume", path, upath.status());
      failed = true;
      continue;
    }
    ConsumeInfo info;
    const Status st = progress && ProgressWanted()
                          ? ConsumeShowingProgress(*client, path, *upath, &info)
                          : client->Consume(path, &info);
    if (!st.ok()) {
      PrintError("consume", path, st);
      failed = true;
      continue;
    }
    if (!verbose) continue;
    std::string what;
    if (info.level1) {
      what = "already complete locally (no request)";
    } else if (info.reply.transferred) {
      what = "transferred " + std::to_string(info.reply.bytes) + " bytes from " + Served(info.reply);
    } else if (info.reply.joined) {
      what = "joined a transfer already in flight (" + Served(info.reply) + ")";
    } else if (info.reply.local) {
      what = "no transfer needed (same directory or shared storage)";
    } else {
      what = "present";
    }
    std::cout << path << ": " << what << " in " << FormatMs(info.elapsed_ns) << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdPrefetch(const std::vector<std::string>& patterns, bool cancel) {
  Result<std::shared_ptr<Client>> client = EnvClient();
  if (!client.ok()) {
    PrintError("prefetch", "", client.status());
    return kExitFailed;
  }
  bool failed = false;
  for (const std::string& p : patterns) {
    Result<uint32_t> n = (*client)->Prefetch(p, cancel);
    if (!n.ok()) {
      PrintError("prefetch", p, n.status());
      failed = true;
    } else if (!cancel) {
      std::cout << p << ": declared; " << *n << " already published file(s) queued\n";
    }
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdList(const std::string& prefix, const std::string& ns, bool ns_given, uint32_t limit,
            bool json) {
  Result<std::shared_ptr<Client>> client = EnvClient();
  if (!client.ok()) {
    PrintError("ls", "", client.status());
    return kExitFailed;
  }
  std::optional<std::string> nsopt;
  if (ns_given) nsopt = ns;
  auto entries = (*client)->List(prefix, limit, nsopt);
  if (!entries.ok()) {
    PrintError("ls", "", entries.status());
    return kExitFailed;
  }
  std::sort(entries->begin(), entries->end(),
            [](const auto& a, const auto& b) { return a.second.upath < b.second.upath; });
  std::set<uint32_t> owner_set;
  for (const auto& [key, rec] : *entries) owner_set.insert(rec.owner_rank);
  std::map<uint32_t, PeerState> owners;
  const bool known =
      OwnerStates(**client, std::vector<uint32_t>(owner_set.begin(), owner_set.end()), &owners);
  // "down", "stale" (its address answers as another service), "unregistered";
  // "unknown" (unmarked) when the service cannot tell.
  auto owner_state = [&](uint32_t rank) -> std::string {
    if (!known) return "unknown";
    auto it = owners.find(rank);
    if (it == owners.end()) return "unregistered";
    return PeerStateName(it->second);
  };
  if (json) {
    Json arr = Json::array();
    for (const auto& [key, rec] : *entries) {
      Json item;
      item["path"] = rec.upath;
      item["key"] = key;
      item["owner_rank"] = rec.owner_rank;
      item["owner_incarnation"] = rec.owner_incarnation;
      item["size"] = rec.size;
      item["version"] = rec.version;
      item["version_time"] = FormatTimeNs(rec.version);
      item["published_ns"] = rec.published_ns;
      item["owner_state"] = owner_state(rec.owner_rank);
      arr.push_back(std::move(item));
    }
    std::cout << arr.dump(2) << "\n";
    return kExitOk;
  }
  // Files whose owner cannot serve them are marked: consuming them waits
  // for the owner's return or fails.
  std::vector<std::string> owner_text;
  size_t wpath = 4, wowner = 5, wsize = 4;
  for (const auto& [key, rec] : *entries) {
    const std::string state = owner_state(rec.owner_rank);
    const bool fine = state == "alive" || state == "unknown";
    owner_text.push_back(std::to_string(rec.owner_rank) + (fine ? "" : " (" + state + ")"));
    wpath = std::max(wpath, rec.upath.size());
    wowner = std::max(wowner, owner_text.back().size());
    wsize = std::max(wsize, std::to_string(rec.size).size());
  }
  std::printf("%-*s  %-*s  %*s  %s\n", static_cast<int>(wpath), "PATH", static_cast<int>(wowner),
              "OWNER", static_cast<int>(wsize), "SIZE", "VERSION");
  for (size_t i = 0; i < entries->size(); ++i) {
    const FileRecord& rec = (*entries)[i].second;
    std::printf("%-*s  %-*s  %*llu  %s\n", static_cast<int>(wpath), rec.upath.c_str(),
                static_cast<int>(wowner), owner_text[i].c_str(), static_cast<int>(wsize),
                static_cast<unsigned long long>(rec.size), FormatTimeNs(rec.version).c_str());
  }
  return kExitOk;
}

int CmdStatus(bool json, bool prometheus) {
  Result<std::shared_ptr<Client>> client = EnvClient();
  if (!client.ok()) {
    PrintError("status", "", client.status());
    return kExitFailed;
  }
  Result<StatusReply> st = (*client)->ServiceStatus();
  if (!st.ok()) {
    PrintError("status", "", st.status());
    return kExitFailed;
  }
  if (prometheus) {
    std::cout << PrometheusText(*st);
    return kExitOk;
  }
  if (json) {
    Json j;
    j["socket"] = (*client)->pool()->socket_path();
    j["info"] = st->info;
    j["counters"] = st->counters;
    Json transfers = Json::array();
    for (const TransferInfo& t : st->transfers) {
      Json x;
      x["direction"] = t.outgoing ? "out" : "in";
      x["path"] = t.upath;
      x["peer_rank"] = t.peer_rank;
      x["transport"] = t.transport;
      x["bytes_done"] = t.bytes_done == TransferInfo::kUnknownBytes ? Json(nullptr) : Json(t.bytes_done);
      x["bytes_total"] = t.bytes_total;
      x["elapsed_ns"] = t.elapsed_ns;
      transfers.push_back(std::move(x));
    }
    j["transfers"] = std::move(transfers);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "dyad-service at " << (*client)->pool()->socket_path() << "\n";
  size_t w = 0;
  for (const auto& [k, v] : st->info) w = std::max(w, k.size());
  for (const auto& [k, v] : st->info)
    std::printf("  %-*s  %s\n", static_cast<int>(w), k.c_str(), v.empty() ? "-" : v.c_str());
  std::cout << "\ncounters:\n";
  w = 0;
  for (const auto& [k, v] : st->counters) w = std::max(w, k.size());
  for (const auto& [k, v] : st->counters)
    std::printf("  %-*s  %12llu\n", static_cast<int>(w), k.c_str(),
                static_cast<unsigned long long>(v));
  std::cout << TransfersTable(st->transfers);
  return kExitOk;
}

}  // namespace cli
}  // namespace dyad
