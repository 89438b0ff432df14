// config.h: the one table of DYAD configuration.
//
// Every environment variable DYAD reads is declared once, in kConfigTable,
// with its default and help text. The client (dyad_init_env), the service,
// and `dyad info` all read this table, so documentation and behaviour cannot
// drift apart. Booleans follow upstream (set means true) except that
// 0/false/no/off (any case) mean false.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace dyad {

enum class ConfigKind { kBool, kUint, kString, kSeconds };

struct ConfigEntry {
  const char* name;
  ConfigKind kind;
  const char* default_value;  // as text; "" means unset/NULL
  const char* used_by;        // "client", "service", "both"
  const char* help;
};

const std::vector<ConfigEntry>& ConfigTable();
// "bool", "integer", "string", "seconds": the type column of the docs.
const char* ConfigKindName(ConfigKind kind);
const ConfigEntry* FindConfigEntry(const std::string& name);

// Raw value of an environment variable, if set.
std::optional<std::string> GetEnv(const char* name);
// Removes `name` from the environment after overwriting its value where it
// is stored (for the initial environment: what /proc/PID/environ shows).
// Not thread-safe (setenv/unsetenv): call it before starting threads.
void EraseEnv(const char* name);
// Parses a boolean the DYAD way. An unset variable gives `def`.
bool EnvBool(const char* name, bool def);
// Parses an unsigned integer; malformed values give an error naming the variable.
Result<uint64_t> EnvUint(const char* name, uint64_t def);
// Parses seconds (fractional allowed); "0", "", "inf" or "none" mean no limit (-1 ms).
Result<int64_t> EnvTimeoutMs(const char* name, int64_t def_ms);
bool ParseBool(const std::string& text);

// True for variables that hold a secret themselves (a name with SECRET or
// PASSWORD that does not end in _FILE): their values are never printed.
bool ConfigValueIsSecret(const std::string& name);
// `value` with passwords inside it replaced by ***: the PASSWORD of
// scheme://[USER]:PASSWORD@HOST (redis://:pw@host) and the values of
// password=, pass=, secret= and token= query parameters.
std::string RedactSecrets(const std::string& value);
// What `dyad info` shows for `name`=`value`: "(set, hidden)" for secret
// variables, else RedactSecrets(value).
std::string ConfigValueForDisplay(const std::string& name, const std::string& value);

// Unix socket of the dyad-service that the Flux module (dyad.so) of the
// broker at `flux_uri` runs: `local:///DIR/NAME` gives `/DIR/dyad-NAME.sock`
// (each broker of an instance has its own local-uri, so two brokers on one
// host get two sockets, in the instance's private run directory). "" when
// `flux_uri` is not a local:// URI naming an absolute path with a directory
// and a name (ssh:// and other remote URIs have no local socket).
std::string FluxServiceSocket(const std::string& flux_uri);

// Default Unix socket of the local service: $DYAD_SERVICE_SOCKET, else
// FluxServiceSocket($FLUX_URI) when FLUX_URI is set and names a local broker
// (the socket of that broker's dyad.so module), else
// /tmp/dyad-<uid>/service.sock.
std::string DefaultServiceSocket();

}  // namespace dyad
