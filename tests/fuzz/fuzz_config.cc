// Fuzz target: the configuration parsers of common/config.cc (the Env*
// readers of the configuration table) and the link protection names.
//
// Input: byte 0 picks the parser; the rest (up to the first NUL, as in a
// real environment) is the variable's value.
#include <cstdlib>
#include <string>

#include "common/config.h"
#include "common/seal.h"
#include "common/time.h"
#include "fuzz/fuzz_util.h"

using namespace dyad;
using dyad::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string value(reinterpret_cast<const char*>(data + 1), size - 1);
  value = value.substr(0, value.find('\0'));
  const char* var = "DYAD_FUZZ_VALUE";
  Check(::setenv(var, value.c_str(), 1) == 0);
  switch (data[0] % 5) {
    case 0:
      Check(EnvBool(var, false) == ParseBool(value));
      break;
    case 1: {
      Result<uint64_t> v = EnvUint(var, 7);
      if (v.ok() && !value.empty()) Check(value[0] != '-');
      if (!v.ok()) Check(v.status().code() == DYAD_RC_BADREQUEST);
      break;
    }
    case 2: {
      Result<int64_t> ms = EnvTimeoutMs(var, 123);
      if (ms.ok()) {
        Check(*ms == -1 || *ms > 0);
        // Whatever was parsed, a deadline from it never lies in the past.
        if (*ms > 1000) Check(!Deadline::AfterMs(*ms).expired());
      } else {
        Check(ms.status().code() == DYAD_RC_BADREQUEST);
      }
      break;
    }
    case 3: {
      Result<LinkProtection> p = ParseLinkProtection(value);
      if (p.ok()) Check(ParseLinkProtection(LinkProtectionName(*p)).ok());
      break;
    }
    default:
      (void)FindConfigEntry(value);
      break;
  }
  ::unsetenv(var);
  return 0;
}
