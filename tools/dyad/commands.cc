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
#include <sstream>
#include <string>

#include "common/backend.h"
#include "common/config.h"
#include "common/munge/munge.h"
#include "common/seal.h"
#include "common/time.h"
#include "dyad/client/dyad_client.hpp"
#include "dyad/dyad_config.hpp"
#include "dyad_version.h"
#include "kvs/kvs.h"
#include "transport/transport.h"

namespace dyad {
namespace cli {
namespace {

using Json = nlohmann::ordered_json;
using client::Client;
using client::Side;

// "dyad produce: a/b: DYAD_RC_NOSERVICE: dyad-service is not reachable ..."
void PrintError(const std::string& cmd, const std::string& what, const client::Status& st) {
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

// A client configured from the environment; for produce and consume it
// must have the `side` managed directory. Reports problems itself.
bool EnvClient(const std::string& cmd, const Side* side, Client* out) {
  client::Status st = Client::FromEnv(out);
  if (!st.ok()) {
    PrintError(cmd, "", st);
    return false;
  }
  if (side == nullptr) return true;
  const bool producer = *side == Side::kProducer;
  if (!(producer ? out->has_producer_path() : out->has_consumer_path())) {
    PrintError(cmd, "",
               client::Status(DYAD_RC_BADMANAGEDPATH,
                              std::string("no ") + (producer ? "producer" : "consumer") +
                                  "-managed directory: set " +
                                  (producer ? "DYAD_PATH_PRODUCER" : "DYAD_PATH_CONSUMER")));
    return false;
  }
  return true;
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
  const Side side = Side::kProducer;
  Client client;
  if (!EnvClient("produce", &side, &client)) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    // Unlike the C API, the C++ client reports a path outside the managed
    // directory (DYAD_RC_UNTRACKED): a user named the file, so say why
    // nothing happened.
    std::string upath;
    client::Status st = client.Resolve(path, side, &upath);
    const uint64_t t0 = MonoNs();
    if (st.ok()) st = client.Produce(path);
    const uint64_t dt = MonoNs() - t0;
    if (!st.ok()) {
      PrintError("produce", path, st);
      failed = true;
      continue;
    }
    if (verbose) std::cout << path << ": published '" << upath << "' in " << FormatMs(dt) << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdConsume(const std::vector<std::string>& paths, double timeout_s, bool verbose) {
  if (timeout_s >= 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", timeout_s);
    ::setenv("DYAD_CONSUME_TIMEOUT", buf, 1);
  }
  const Side side = Side::kConsumer;
  Client client;
  if (!EnvClient("consume", &side, &client)) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    client::ConsumeInfo info;
    const client::Status st = client.Consume(path, &info);
    if (!st.ok()) {
      PrintError("consume", path, st);
      failed = true;
      continue;
    }
    if (!verbose) continue;
    std::string what;
    if (info.level1) {
      what = "already complete locally (no request)";
    } else if (info.transferred) {
      what = "transferred " + std::to_string(info.bytes) + " bytes from rank " +
             std::to_string(info.metadata.owner_rank);
    } else if (info.joined) {
      what = "joined a transfer already in flight";
    } else if (info.local) {
      what = "no transfer needed (same directory or shared storage)";
    } else {
      what = "present";
    }
    std::cout << path << ": " << what << " in " << FormatMs(info.elapsed_ns) << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdList(const std::string& prefix, const std::string& ns, bool ns_given, uint32_t limit,
            bool json) {
  Client client;
  if (!EnvClient("ls", nullptr, &client)) return kExitFailed;
  std::vector<client::ListEntry> entries;
  const client::Status st = ns_given ? client.ListNamespace(ns, prefix, limit, &entries)
                                     : client.List(prefix, limit, &entries);
  if (!st.ok()) {
    PrintError("ls", "", st);
    return kExitFailed;
  }
  if (json) {
    Json arr = Json::array();
    for (const client::ListEntry& e : entries) {
      const client::Metadata& rec = e.metadata;
      Json item;
      item["path"] = rec.path;
      item["key"] = e.key;
      item["owner_rank"] = rec.owner_rank;
      item["owner_incarnation"] = rec.owner_incarnation;
      item["size"] = rec.size;
      item["version"] = rec.version;
      item["version_time"] = FormatTimeNs(rec.version);
      item["published_ns"] = rec.published_ns;
      arr.push_back(std::move(item));
    }
    std::cout << arr.dump(2) << "\n";
    return kExitOk;
  }
  size_t wpath = 4;
  size_t wsize = 4;
  for (const client::ListEntry& e : entries) {
    wpath = std::max(wpath, e.metadata.path.size());
    wsize = std::max(wsize, std::to_string(e.metadata.size).size());
  }
  char line[64];
  std::printf("%-*s  %5s  %*s  %s\n", static_cast<int>(wpath), "PATH", "OWNER",
              static_cast<int>(wsize), "SIZE", "VERSION");
  for (const client::ListEntry& e : entries) {
    const client::Metadata& rec = e.metadata;
    std::snprintf(line, sizeof line, "%u", rec.owner_rank);
    std::printf("%-*s  %5s  %*llu  %s\n", static_cast<int>(wpath), rec.path.c_str(), line,
                static_cast<int>(wsize), static_cast<unsigned long long>(rec.size),
                FormatTimeNs(rec.version).c_str());
  }
  return kExitOk;
}

int CmdStatus(bool json) {
  Client client;
  if (!EnvClient("status", nullptr, &client)) return kExitFailed;
  client::ServiceStatus status;
  const client::Status st = client.GetServiceStatus(&status);
  if (!st.ok()) {
    PrintError("status", "", st);
    return kExitFailed;
  }
  const std::string socket = client.options().service_socket;
  if (json) {
    Json j;
    j["socket"] = socket;
    j["info"] = status.info;
    j["counters"] = status.counters;
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "dyad-service at " << socket << "\n";
  size_t w = 0;
  for (const auto& [k, v] : status.info) w = std::max(w, k.size());
  for (const auto& [k, v] : status.info)
    std::printf("  %-*s  %s\n", static_cast<int>(w), k.c_str(), v.empty() ? "-" : v.c_str());
  std::cout << "\ncounters:\n";
  w = 0;
  for (const auto& [k, v] : status.counters) w = std::max(w, k.size());
  for (const auto& [k, v] : status.counters)
    std::printf("  %-*s  %12llu\n", static_cast<int>(w), k.c_str(),
                static_cast<unsigned long long>(v));
  return kExitOk;
}

}  // namespace cli
}  // namespace dyad
