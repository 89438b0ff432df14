#include "commands.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "common/backend.h"
#include "common/config.h"
#include "common/seal.h"
#include "common/time.h"
#include "dyad_version.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/munge/munge.h"
#include "transport/transport.h"

namespace dyad {
namespace cli {
namespace {

using Json = nlohmann::ordered_json;

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
      // Secrets are never printed: set or not, nothing more.
      item["current"] = cur ? Json(ConfigValueForDisplay(e.name, *cur)) : Json(nullptr);
      if (cur && ConfigValueIsSecret(e.name)) item["hidden"] = true;
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
              << (row->built ? "built"
                             : "not built: " + std::string(row->build_switch) + "=OFF or " +
                                   row->needs + " missing")
              << "]\n    " << (t ? "DTL modes: " : "URL forms: ") << sel
              << "   capabilities: " << CapsText(*row) << "\n"
              << Wrap(row->summary, width, "    ") << "\n";
  }
  std::cout << "\n";
  for (const ConfigEntry& e : table) {
    std::optional<std::string> cur = GetEnv(e.name);
    std::cout << e.name << "\n"
              << "    current: "
              << (cur ? ConfigValueIsSecret(e.name)
                            ? ConfigValueForDisplay(e.name, *cur)
                            : "'" + ConfigValueForDisplay(e.name, *cur) + "'"
                      : std::string("(unset)"))
              << "   default: " << (*e.default_value ? e.default_value : "(unset)")
              << "   type: " << ConfigKindName(e.kind) << "   used by: " << e.used_by << "\n"
              << Wrap(e.help, width, "    ") << "\n";
  }
  return kExitOk;
}

int CmdSecretInit(const std::string& path) {
  Result<std::string> secret = NewClusterSecret();
  if (!secret.ok()) {
    std::cerr << "dyad secret init: " << secret.status().message() << "\n";
    return kExitFailed;
  }
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, S_IRUSR | S_IWUSR);
  if (fd < 0) {
    const int err = errno;
    std::cerr << "dyad secret init: cannot create '" << path << "': " << std::strerror(err)
              << (err == EEXIST ? " (an existing secret is never overwritten; remove it first)"
                                : "")
              << "\n";
    return kExitFailed;
  }
  const std::string line = *secret + "\n";
  const bool ok = ::fchmod(fd, S_IRUSR | S_IWUSR) == 0 &&
                  ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size()) &&
                  ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    std::cerr << "dyad secret init: cannot write '" << path << "': " << std::strerror(err) << "\n";
    return kExitFailed;
  }
  std::cout << "wrote a new cluster secret (256 random bits) to " << path
            << " (mode 600); give every service of the cluster this file (--secret-file or "
               "DYAD_SECRET_FILE)\n";
  return kExitOk;
}

int CmdSecretCheck(const std::string& path) {
  if (path.empty()) {
    std::cerr << "dyad secret check: a FILE is needed\n";
    return kExitUsage;
  }
  Result<std::string> secret = LoadClusterSecret(path);
  if (!secret.ok()) {
    std::cerr << "dyad secret check: " << secret.status().message() << "\n";
    return kExitFailed;
  }
  char bits[32];
  std::snprintf(bits, sizeof bits, "%.0f", SecretStrengthBits(*secret));
  std::cout << path << ": usable cluster secret (" << secret->size() << " bytes, at most " << bits
            << " bits)\n";
  return kExitOk;
}

}  // namespace cli
}  // namespace dyad
