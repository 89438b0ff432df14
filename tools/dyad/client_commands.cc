// client_commands.cc: the `dyad` subcommands that talk to the local
// dyad-service (produce, consume, prefetch, ls, status). They use the public
// C++ client of libdyad_ctx (dyad/client/dyad_client.hpp), the same client
// the C API, the streams and pydyad are built on, so the command behaves as
// any application would.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "dyad/client/dyad_client.hpp"
#include "inspect.h"

namespace dyad {
namespace cli {
namespace {

using Json = nlohmann::ordered_json;
namespace dc = ::dyad::client;

uint64_t NowMonoNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// "dyad produce: a/b: DYAD_RC_NOSERVICE: dyad-service is not reachable ..."
void PrintError(const std::string& cmd, const std::string& what, const dc::Status& st) {
  std::string line = "dyad " + cmd + ": ";
  if (!what.empty()) line += what + ": ";
  std::cerr << line << st.ToString() << "\n";
}

std::string FormatMs(uint64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f ms", static_cast<double>(ns) / 1e6);
  return buf;
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

// A client configured from the environment. With `side`, the command needs
// that managed directory and says so when it is not set. Reports problems
// itself; false on failure.
bool ClientFromEnv(const std::string& cmd, const dc::Side* side, dc::Client* out) {
  dc::Options o;
  if (dc::Status st = dc::Options::FromEnv(&o); !st.ok()) {
    PrintError(cmd, "", st);
    return false;
  }
  if (side != nullptr) {
    const bool producer = *side == dc::Side::kProducer;
    if ((producer ? o.producer_path : o.consumer_path).empty()) {
      PrintError(cmd, "",
                 dc::Status(DYAD_RC_BADMANAGEDPATH,
                            std::string("no ") + (producer ? "producer" : "consumer") +
                                "-managed directory: set " +
                                (producer ? "DYAD_PATH_PRODUCER" : "DYAD_PATH_CONSUMER")));
      return false;
    }
  }
  // From the environment as a whole: Options has no field for everything a
  // client reads there (DYAD_PREFETCH), and Create(o) would drop it.
  if (dc::Status st = dc::Client::FromEnv(out); !st.ok()) {
    PrintError(cmd, "", st);
    return false;
  }
  return true;
}

// "rank 0 (10.0.0.1:7590) over tcp": who served a consume and how.
std::string Served(const dc::ConsumeInfo& info) {
  std::string s = "rank " + std::to_string(info.metadata.owner_rank);
  if (!info.owner_address.empty()) s += " (" + info.owner_address + ")";
  if (!info.transport.empty()) s += " over " + info.transport;
  return s;
}

std::string WhatHappened(const dc::ConsumeInfo& info) {
  if (info.level1) return "already complete locally (no request)";
  if (info.transferred)
    return "transferred " + std::to_string(info.bytes) + " bytes from " + Served(info);
  if (info.joined) return "joined a transfer already in flight (" + Served(info) + ")";
  if (info.local && info.transport == "prefetched")
    return "no transfer needed: prefetched ahead by the local dyad-service (owner rank " +
           std::to_string(info.metadata.owner_rank) + ")";
  if (info.local && info.transport == "cached")
    return "no transfer needed: a current copy fetched earlier (owner rank " +
           std::to_string(info.metadata.owner_rank) + ")";
  if (info.local) return "no transfer needed (same directory or shared storage)";
  return "present";
}

// The "waiting for publication" section of `dyad status` ("" when none).
std::string WaitsTable(const std::vector<dc::WaitingRequest>& waits) {
  if (waits.empty()) return "";
  std::string out = "\nwaiting for publication:\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-8s %8s %9s  %-16s %s\n", "kind", "pid", "age", "namespace",
                "path");
  out += line;
  for (const dc::WaitingRequest& q : waits) {
    char age[32];
    std::snprintf(age, sizeof age, "%.1f s", static_cast<double>(q.age_ns) / 1e9);
    std::snprintf(line, sizeof line, "  %-8s %8u %9s  %-16s ", q.kind.c_str(), q.pid, age,
                  q.kvs_namespace.c_str());
    out += line + q.path + "\n";
    if (!q.unpublished_local_file.empty())
      out += "           '" + q.unpublished_local_file +
             "' exists on this node but was never published (written outside DYAD?); publish "
             "it with `dyad produce`, or read it without DYAD\n";
  }
  return out;
}

}  // namespace

int CmdProduce(const std::vector<std::string>& paths, bool verbose) {
  const dc::Side side = dc::Side::kProducer;
  // The command reports each file's result, so it publishes synchronously
  // even with DYAD_ASYNC_PUBLISH set (an asynchronous failure would only
  // reach a later call, and this process exits after its last file).
  ::unsetenv("DYAD_ASYNC_PUBLISH");
  dc::Client client;
  if (!ClientFromEnv("produce", &side, &client)) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    // The C API ignores paths outside the managed directory (upstream);
    // here a user named the file, so say why nothing happened.
    std::string upath;
    if (dc::Status st = client.Resolve(path, side, &upath); !st.ok()) {
      PrintError("produce", path, st);
      failed = true;
      continue;
    }
    const uint64_t t0 = NowMonoNs();
    const dc::Status st = client.Produce(path);
    const uint64_t dt = NowMonoNs() - t0;
    if (!st.ok()) {
      PrintError("produce", path, st);
      failed = true;
      continue;
    }
    if (verbose) std::cout << path << ": published '" << upath << "' in " << FormatMs(dt) << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdConsume(const std::vector<std::string>& paths, double timeout_s, bool verbose,
               bool progress) {
  // --timeout is DYAD_CONSUME_TIMEOUT for this command, parsed the same way
  // (0: no limit; huge values saturate).
  if (timeout_s >= 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", timeout_s);
    ::setenv("DYAD_CONSUME_TIMEOUT", buf, 1);
  }
  const dc::Side side = dc::Side::kConsumer;
  dc::Client client;
  if (!ClientFromEnv("consume", &side, &client)) return kExitFailed;
  bool failed = false;
  for (const std::string& path : paths) {
    std::string upath;
    if (dc::Status st = client.Resolve(path, side, &upath); !st.ok()) {
      PrintError("consume", path, st);
      failed = true;
      continue;
    }
    dc::ConsumeInfo info;
    const dc::Status st = progress && ProgressWanted()
                              ? ConsumeShowingProgress(client, path, upath, &info)
                              : client.Consume(path, &info);
    if (!st.ok()) {
      PrintError("consume", path, st);
      failed = true;
      continue;
    }
    if (verbose)
      std::cout << path << ": " << WhatHappened(info) << " in " << FormatMs(info.elapsed_ns)
                << "\n";
  }
  return failed ? kExitFailed : kExitOk;
}

int CmdPrefetch(const std::vector<std::string>& patterns, bool cancel) {
  dc::Client client;
  if (!ClientFromEnv("prefetch", nullptr, &client)) return kExitFailed;
  bool failed = false;
  for (const std::string& p : patterns) {
    uint32_t queued = 0;
    if (dc::Status st = client.Prefetch(p, cancel, &queued); !st.ok()) {
      PrintError("prefetch", p, st);
      failed = true;
    } else if (!cancel) {
      std::cout << p << ": declared; " << queued << " already published file(s) queued\n";
    }
  }
  return failed ? kExitFailed : kExitOk;
}

namespace {

void PrintListJson(const std::vector<dc::ListEntry>& entries,
                   const std::function<std::string(uint32_t)>& owner_state) {
  Json arr = Json::array();
  for (const dc::ListEntry& e : entries) {
    const dc::Metadata& m = e.metadata;
    Json item;
    item["path"] = m.path;
    item["key"] = e.key;
    item["owner_rank"] = m.owner_rank;
    item["owner_incarnation"] = m.owner_incarnation;
    item["size"] = m.size;
    item["version"] = m.version;
    item["version_time"] = FormatTimeNs(m.version);
    item["published_ns"] = m.published_ns;
    item["owner_state"] = owner_state(m.owner_rank);
    arr.push_back(std::move(item));
  }
  std::cout << arr.dump(2) << "\n";
}

// Files whose owner cannot serve them are marked: consuming them waits for
// the owner's return or fails.
void PrintListTable(const std::vector<dc::ListEntry>& entries,
                    const std::function<std::string(uint32_t)>& owner_state) {
  std::vector<std::string> owner_text;
  size_t wpath = 4, wowner = 5, wsize = 4;
  for (const dc::ListEntry& e : entries) {
    const std::string state = owner_state(e.metadata.owner_rank);
    const bool fine = state == "alive" || state == "unknown";
    owner_text.push_back(std::to_string(e.metadata.owner_rank) + (fine ? "" : " (" + state + ")"));
    wpath = std::max(wpath, e.metadata.path.size());
    wowner = std::max(wowner, owner_text.back().size());
    wsize = std::max(wsize, std::to_string(e.metadata.size).size());
  }
  std::printf("%-*s  %-*s  %*s  %s\n", static_cast<int>(wpath), "PATH", static_cast<int>(wowner),
              "OWNER", static_cast<int>(wsize), "SIZE", "VERSION");
  for (size_t i = 0; i < entries.size(); ++i) {
    const dc::Metadata& m = entries[i].metadata;
    std::printf("%-*s  %-*s  %*llu  %s\n", static_cast<int>(wpath), m.path.c_str(),
                static_cast<int>(wowner), owner_text[i].c_str(), static_cast<int>(wsize),
                static_cast<unsigned long long>(m.size), FormatTimeNs(m.version).c_str());
  }
}

}  // namespace

int CmdList(const std::string& prefix, const std::string& ns, bool ns_given, uint32_t limit,
            bool json) {
  dc::Client client;
  if (!ClientFromEnv("ls", nullptr, &client)) return kExitFailed;
  std::vector<dc::ListEntry> entries;
  const dc::Status st = ns_given ? client.ListNamespace(ns, prefix, limit, &entries)
                                 : client.List(prefix, limit, &entries);
  if (!st.ok()) {
    PrintError("ls", "", st);
    return kExitFailed;
  }
  std::sort(entries.begin(), entries.end(), [](const dc::ListEntry& a, const dc::ListEntry& b) {
    return a.metadata.path < b.metadata.path;
  });
  std::set<uint32_t> owner_set;
  for (const dc::ListEntry& e : entries) owner_set.insert(e.metadata.owner_rank);
  std::map<uint32_t, dc::PeerState> owners;
  const bool known =
      OwnerStates(client, std::vector<uint32_t>(owner_set.begin(), owner_set.end()), &owners);
  // "down", "stale" (its address answers as another service), "unregistered";
  // "unknown" (unmarked) when the service cannot tell.
  auto owner_state = [&](uint32_t rank) -> std::string {
    if (!known) return "unknown";
    auto it = owners.find(rank);
    if (it == owners.end()) return "unregistered";
    return dc::PeerStateName(it->second);
  };
  if (json)
    PrintListJson(entries, owner_state);
  else
    PrintListTable(entries, owner_state);
  return kExitOk;
}

int CmdStatus(bool json, bool prometheus) {
  dc::Client client;
  if (!ClientFromEnv("status", nullptr, &client)) return kExitFailed;
  dc::ServiceStatus st;
  std::vector<dc::WaitingRequest> waits;
  if (dc::Status rc = client.GetServiceStatus(&st, &waits); !rc.ok()) {
    PrintError("status", "", rc);
    return kExitFailed;
  }
  if (prometheus) {
    std::cout << PrometheusText(st);
    return kExitOk;
  }
  if (json) {
    Json j;
    j["socket"] = st.socket;
    j["info"] = st.info;
    j["counters"] = st.counters;
    Json transfers = Json::array();
    for (const dc::Transfer& t : st.transfers) {
      Json x;
      x["direction"] = t.outgoing ? "out" : "in";
      x["path"] = t.path;
      x["peer_rank"] = t.peer_rank;
      x["transport"] = t.transport;
      x["bytes_done"] =
          t.bytes_done == dc::Transfer::kUnknownBytes ? Json(nullptr) : Json(t.bytes_done);
      x["bytes_total"] = t.bytes_total;
      x["elapsed_ns"] = t.elapsed_ns;
      transfers.push_back(std::move(x));
    }
    j["transfers"] = std::move(transfers);
    Json jw = Json::array();
    for (const dc::WaitingRequest& q : waits) {
      Json x;
      x["kind"] = q.kind;
      x["path"] = q.path;
      x["namespace"] = q.kvs_namespace;
      x["pid"] = q.pid;
      x["age_ns"] = q.age_ns;
      x["unpublished_local_file"] =
          q.unpublished_local_file.empty() ? Json(nullptr) : Json(q.unpublished_local_file);
      jw.push_back(std::move(x));
    }
    j["waits"] = std::move(jw);
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::cout << "dyad-service at " << st.socket << "\n";
  size_t w = 0;
  for (const auto& kv : st.info) w = std::max(w, kv.first.size());
  for (const auto& kv : st.info)
    std::printf("  %-*s  %s\n", static_cast<int>(w), kv.first.c_str(),
                kv.second.empty() ? "-" : kv.second.c_str());
  std::cout << "\ncounters:\n";
  w = 0;
  for (const auto& kv : st.counters) w = std::max(w, kv.first.size());
  for (const auto& kv : st.counters)
    std::printf("  %-*s  %12llu\n", static_cast<int>(w), kv.first.c_str(),
                static_cast<unsigned long long>(kv.second));
  std::cout << TransfersTable(st.transfers);
  std::cout << WaitsTable(waits);
  return kExitOk;
}

}  // namespace cli
}  // namespace dyad
