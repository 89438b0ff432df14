// flux_keys.h: how the flux:// store lays out keys and values in a Flux KVS.
//
// Plain functions, no libflux: the store (flux_kvs.cc) writes and reads
// through them, and a client that reads records of a Flux instance with
// libflux loaded at run time decodes them the same way.
//
// Namespaces: our namespace `ns` is the Flux KVS namespace of the same
// name; the empty namespace is Flux's primary namespace ("primary", so ""
// and "primary" name the same one).
//
// Keys: in Flux `.` separates directories, so a path such as
// `a.b.c.file0` would become directories a, b, c and collide with
// `a.b.c.file0.dat` (the first value turns into a directory), and `run`
// would remove `run.log`. Every key is therefore stored as ONE path
// component, its leaf, in which every byte other than [A-Za-z0-9] and
// `-_/:@+,=~` is written %XX (upper-case hex): `.`, `%`, NUL, spaces,
// quotes, shell glob characters and every non-ASCII byte. `%` is always
// escaped, so two keys never share a leaf; the empty key is the leaf `%`
// (which no other key escapes to). Leaves are spread over 256 directories
// (a Flux directory is rewritten whole by each commit to it, so one flat
// directory would make publishing slower as it grows):
//
//     <top>.<bin>.<leaf>      e.g. dyad.3e.a%2Eb%2Ec%2Efile0
//
// where <top> is "dyad" (flux://?dir=NAME chooses another) and <bin> two
// lower-case hex digits of FNV-1a-32 of the key. Every key of a namespace
// is at the same depth, so no key is ever a directory of another.
//
// Values: JSON text a person can read with `flux kvs get`:
//   a FileRecord (proto/protocol.h)   {"dyad":"file","owner_rank":1,...,"upath":"a/b"}
//   a ServiceRecord                   {"dyad":"service","rank":0,...,"address":"h:p"}
//   other UTF-8 text                  {"dyad":"text","text":"..."}
//   other bytes                       {"dyad":"bytes","base64":"..."}
// Records are recognised only when their encoding decodes and re-encodes to
// exactly the same bytes, so every value reads back byte for byte.
//
// For anyone waiting on these keys with FLUX_KVS_WAITCREATE: create the
// namespace first (flux_kvs_namespace_create; EEXIST is fine). flux-core's
// kvs-watch (0.73.0 and 0.88) aborts the broker when two WAITCREATE
// lookups reach a namespace that does not exist yet before its first root
// is known (kvs-watch.c, assert nsm->commit != NULL).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "proto/protocol.h"

namespace dyad {

// The top directory of the store's keys in each namespace.
inline constexpr const char* kFluxDefaultTopDir = "dyad";

// The Flux namespace of our namespace `ns`.
std::string FluxNamespace(const std::string& ns);

// A top directory name is valid when it is 1..64 bytes of [A-Za-z0-9_-].
bool FluxValidTopDir(const std::string& top);

// The leaf of `key` (one Flux path component, never empty) and back; an
// invalid leaf (a bad or lower-case escape, a byte that should have been
// escaped) gives false.
std::string FluxEscapeKey(std::string_view key);
bool FluxUnescapeKey(std::string_view leaf, std::string* key);

// The bin directory of `key`: two lower-case hex digits.
std::string FluxKeyBin(std::string_view key);

// The full Flux key of `key` under `top`: "<top>.<bin>.<leaf>".
std::string FluxKeyPath(const std::string& top, std::string_view key);

// The JSON text stored for `value`, and the value back from that text
// (false, with `error` set, when the text is not one of the forms above).
std::string FluxEncodeValue(const std::string& value);
bool FluxDecodeValue(std::string_view json, std::string* value, std::string* error = nullptr);

// The FileRecord a value holds (a client reading records straight from
// the KVS): false when the text is no record.
bool FluxDecodeFileRecord(std::string_view json, FileRecord* out);

// --- JSON helpers (also used to read Flux's directory objects) -------------

// The members of a JSON object as (name, raw JSON text of the value), in
// the order written; false when `json` is not one object.
bool JsonObjectMembers(std::string_view json,
                       std::vector<std::pair<std::string, std::string>>* out);
// A JSON string literal's value (UTF-8), or false.
bool JsonStringValue(std::string_view json, std::string* out);
// `s` as a JSON string literal (UTF-8 expected; control bytes escaped).
std::string JsonQuote(std::string_view s);

// Standard base64 (with padding) and back.
std::string Base64Encode(std::string_view bytes);
bool Base64Decode(std::string_view text, std::string* bytes);

}  // namespace dyad
