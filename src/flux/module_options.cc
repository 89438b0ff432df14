#include "flux/module_options.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

namespace dyad {

namespace {

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

Status Bad(const std::string& what) {
  return Status(DYAD_RC_BADREQUEST, "dyad.so: " + what + " (see: flux module load dyad.so --help)");
}

}  // namespace

bool IsModuleMode(const std::string& mode) {
  const std::string m = Upper(mode);
  return m == "UCX" || m == "FLUX_RPC" || m == "MARGO" || m == "TCP" || m == "OFI";
}

Result<ModuleOptions> ParseModuleOptions(const std::vector<std::string>& args) {
  ModuleOptions o;
  bool only_operands = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (only_operands || a.empty() || a[0] != '-' || a == "-") {
      if (!o.producer_path.empty())
        return Bad("more than one producer path: '" + o.producer_path + "' and '" + a + "'");
      if (a.empty()) return Bad("empty producer path");
      o.producer_path = a;
      continue;
    }
    if (a == "--") {
      only_operands = true;
      continue;
    }
    // --name=value, --name value, -x value, -xvalue
    std::string name, value;
    bool has_value = false;
    if (a.compare(0, 2, "--") == 0) {
      const size_t eq = a.find('=');
      name = a.substr(0, eq);
      if (eq != std::string::npos) {
        value = a.substr(eq + 1);
        has_value = true;
      }
    } else {
      name = a.substr(0, 2);
      if (a.size() > 2) {
        value = a.substr(2);
        has_value = true;
      }
    }
    auto take = [&](const char* what) -> Result<std::string> {
      if (has_value) return value;
      if (i + 1 >= args.size()) return Bad(name + " needs " + what);
      return args[++i];
    };
    auto flag = [&]() -> Status {
      if (has_value) return Bad(name + " takes no value");
      return Status::OK();
    };
    if (name == "-h" || name == "--help") {
      if (Status st = flag(); !st.ok()) return st;
      o.help = true;
    } else if (name == "-d" || name == "--debug") {
      if (Status st = flag(); !st.ok()) return st;
      o.debug = true;
    } else if (name == "-m" || name == "--mode") {
      Result<std::string> v = take("a mode");
      if (!v.ok()) return v.status();
      if (!IsModuleMode(*v))
        return Bad("unknown mode '" + *v + "' for " + name + " (UCX, FLUX_RPC, MARGO, TCP or OFI)");
      o.mode = Upper(*v);
    } else if (name == "-i" || name == "--info_log" || name == "--info-log") {
      Result<std::string> v = take("a file");
      if (!v.ok()) return v.status();
      if (v->empty()) return Bad(name + " needs a file");
      o.info_log = *v;
    } else if (name == "-e" || name == "--error_log" || name == "--error-log") {
      Result<std::string> v = take("a file");
      if (!v.ok()) return v.status();
      if (v->empty()) return Bad(name + " needs a file");
      o.error_log = *v;
    } else if (name == "-k" || name == "--kvs") {
      Result<std::string> v = take("a store URL");
      if (!v.ok()) return v.status();
      if (v->empty()) return Bad(name + " needs a store URL");
      o.kvs = *v;
    } else if (name == "--service") {
      Result<std::string> v = take("the path of dyad-service");
      if (!v.ok()) return v.status();
      if (v->empty() || (*v)[0] != '/') return Bad("--service needs an absolute path");
      o.service = *v;
    } else if (name == "--ready-timeout") {
      Result<std::string> v = take("seconds");
      if (!v.ok()) return v.status();
      char* end = nullptr;
      const double s = std::strtod(v->c_str(), &end);
      if (v->empty() || *end != '\0' || !(s > 0) || s > 3600)
        return Bad("--ready-timeout needs seconds in (0, 3600], not '" + *v + "'");
      o.ready_timeout_s = s;
    } else if (name == "--fetch-chunk") {
      Result<std::string> v = take("bytes");
      if (!v.ok()) return v.status();
      char* end = nullptr;
      const unsigned long long b = std::strtoull(v->c_str(), &end, 10);
      if (v->empty() || (*v)[0] == '-' || *end != '\0' || b < 4096 || b > (1ull << 30))
        return Bad("--fetch-chunk needs bytes in [4096, 1073741824], not '" + *v + "'");
      o.fetch_chunk = b;
    } else {
      return Bad("unknown option '" + a + "'");
    }
  }
  return o;
}

std::string ModuleHelp() {
  return "Usage: flux module load dyad.so [OPTIONS] [PRODUCER_PATH]\n"
         "Runs this broker's dyad-service (a supervised child of the broker) and serves\n"
         "dyad.fetch for files beneath PRODUCER_PATH (default: DYAD_PATH_PRODUCER).\n"
         "  -h, --help             show this help and do not load the module\n"
         "  -d, --debug            debug logging (to flux dmesg)\n"
         "  -m, --mode MODE        transport for fetches: UCX, FLUX_RPC, MARGO, TCP or OFI\n"
         "                         (default: DYAD_DTL_MODE, else FLUX_RPC)\n"
         "  -i, --info_log FILE    info/debug messages to FILE.<rank> instead of flux dmesg\n"
         "  -e, --error_log FILE   warnings/errors to FILE.<rank> instead of flux dmesg\n"
         "  -k, --kvs URL          metadata store: flux:// (default, this instance's KVS),\n"
         "                         embedded (hosted by rank 0's service), redis://HOST:PORT\n"
         "  --service PATH         the dyad-service binary (default: beside dyad.so,\n"
         "                         ../bin/dyad-service)\n"
         "  --ready-timeout SEC    how long `flux module load` waits for the service (60)\n"
         "  --fetch-chunk BYTES    bytes per dyad.fetch response (16 MiB; upstream's\n"
         "                         consumers need a file in one response)\n";
}

}  // namespace dyad
