// flux_keys.cc: the flux:// store's key and value encoding (flux_keys.h).
#include "kvs/flux/flux_keys.h"

#include <cstdint>
#include <cstdio>
#include <map>

namespace dyad {
namespace {

bool KeptInLeaf(unsigned char c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return true;
  switch (c) {
    case '-':
    case '_':
    case '/':
    case ':':
    case '@':
    case '+':
    case ',':
    case '=':
    case '~':
      return true;
    default:
      return false;
  }
}

int UpperHexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// --- a small JSON reader: enough to split objects and read our values -----

void SkipSpace(std::string_view s, size_t* i) {
  while (*i < s.size() && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r')) ++*i;
}

bool ParseHex4(std::string_view s, size_t i, uint32_t* out) {
  if (i + 4 > s.size()) return false;
  uint32_t v = 0;
  for (size_t k = 0; k < 4; ++k) {
    const char c = s[i + k];
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v |= static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      v |= static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return false;
    }
  }
  *out = v;
  return true;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Parses the string literal at s[*i] (which is '"'); `out` may be null.
bool ParseString(std::string_view s, size_t* i, std::string* out) {
  if (*i >= s.size() || s[*i] != '"') return false;
  size_t k = *i + 1;
  while (k < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    if (c == '"') {
      *i = k + 1;
      return true;
    }
    if (c < 0x20) return false;
    if (c != '\\') {
      if (out) out->push_back(static_cast<char>(c));
      ++k;
      continue;
    }
    if (k + 1 >= s.size()) return false;
    const char e = s[k + 1];
    char plain = 0;
    switch (e) {
      case '"':
        plain = '"';
        break;
      case '\\':
        plain = '\\';
        break;
      case '/':
        plain = '/';
        break;
      case 'b':
        plain = '\b';
        break;
      case 'f':
        plain = '\f';
        break;
      case 'n':
        plain = '\n';
        break;
      case 'r':
        plain = '\r';
        break;
      case 't':
        plain = '\t';
        break;
      case 'u': {
        uint32_t cp = 0;
        if (!ParseHex4(s, k + 2, &cp)) return false;
        k += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          uint32_t lo = 0;
          if (k + 1 >= s.size() || s[k] != '\\' || s[k + 1] != 'u' || !ParseHex4(s, k + 2, &lo) ||
              lo < 0xDC00 || lo > 0xDFFF)
            return false;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          k += 6;
        } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
          return false;
        }
        if (out) AppendUtf8(cp, out);
        continue;
      }
      default:
        return false;
    }
    if (out) out->push_back(plain);
    k += 2;
  }
  return false;
}

bool SkipValue(std::string_view s, size_t* i, int depth);

bool SkipContainer(std::string_view s, size_t* i, int depth, char close, bool object) {
  ++*i;  // the opening bracket
  SkipSpace(s, i);
  if (*i < s.size() && s[*i] == close) {
    ++*i;
    return true;
  }
  while (true) {
    SkipSpace(s, i);
    if (object) {
      if (!ParseString(s, i, nullptr)) return false;
      SkipSpace(s, i);
      if (*i >= s.size() || s[*i] != ':') return false;
      ++*i;
    }
    if (!SkipValue(s, i, depth + 1)) return false;
    SkipSpace(s, i);
    if (*i >= s.size()) return false;
    if (s[*i] == ',') {
      ++*i;
      continue;
    }
    if (s[*i] != close) return false;
    ++*i;
    return true;
  }
}

bool SkipValue(std::string_view s, size_t* i, int depth) {
  if (depth > 64) return false;
  SkipSpace(s, i);
  if (*i >= s.size()) return false;
  const char c = s[*i];
  if (c == '"') return ParseString(s, i, nullptr);
  if (c == '{') return SkipContainer(s, i, depth, '}', true);
  if (c == '[') return SkipContainer(s, i, depth, ']', false);
  for (const char* word : {"true", "false", "null"}) {
    const std::string_view w(word);
    if (s.substr(*i, w.size()) == w) {
      *i += w.size();
      return true;
    }
  }
  const size_t start = *i;
  if (s[*i] == '-') ++*i;
  while (*i < s.size() && ((s[*i] >= '0' && s[*i] <= '9') || s[*i] == '.' || s[*i] == 'e' ||
                           s[*i] == 'E' || s[*i] == '+' || s[*i] == '-'))
    ++*i;
  return *i > start && s[start] != '.';
}

bool JsonUint(std::string_view raw, uint64_t max, uint64_t* out) {
  if (raw.empty() || raw.size() > 20) return false;
  if (raw.size() > 1 && raw[0] == '0') return false;
  uint64_t v = 0;
  for (char c : raw) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // overlong forms, surrogates and beyond U+10FFFF are not UTF-8
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return false;
    i += n + 1;
  }
  return true;
}

// Writes "name":value pairs.
class JsonObjectWriter {
 public:
  JsonObjectWriter& Str(const char* name, std::string_view v) {
    Name(name);
    out_ += JsonQuote(v);
    return *this;
  }
  JsonObjectWriter& Num(const char* name, uint64_t v) {
    Name(name);
    out_ += std::to_string(v);
    return *this;
  }
  std::string Take() { return out_ + "}"; }

 private:
  void Name(const char* name) {
    out_ += out_.size() > 1 ? "," : "";
    out_ += JsonQuote(name);
    out_ += ":";
  }
  std::string out_ = "{";
};

using Members = std::map<std::string, std::string>;

bool MemberStr(const Members& m, const char* name, std::string* out) {
  auto it = m.find(name);
  return it != m.end() && JsonStringValue(it->second, out);
}

template <typename T>
bool MemberUint(const Members& m, const char* name, T* out, bool optional = false) {
  auto it = m.find(name);
  if (it == m.end()) return optional;
  uint64_t v = 0;
  if (!JsonUint(it->second, static_cast<uint64_t>(static_cast<T>(-1)), &v)) return false;
  *out = static_cast<T>(v);
  return true;
}

bool FileRecordFromMembers(const Members& m, FileRecord* r) {
  return MemberUint(m, "owner_rank", &r->owner_rank) &&
         MemberUint(m, "owner_incarnation", &r->owner_incarnation) &&
         MemberUint(m, "size", &r->size) && MemberUint(m, "version", &r->version) &&
         MemberUint(m, "published_ns", &r->published_ns) && MemberStr(m, "upath", &r->upath) &&
         MemberUint(m, "seq", &r->seq, true);
}

bool ServiceRecordFromMembers(const Members& m, ServiceRecord* r) {
  return MemberUint(m, "rank", &r->rank) && MemberUint(m, "node_idx", &r->node_idx) &&
         MemberUint(m, "incarnation", &r->incarnation) && MemberStr(m, "address", &r->address) &&
         MemberStr(m, "prod_path", &r->prod_path) && MemberStr(m, "hostname", &r->hostname) &&
         MemberUint(m, "started_ns", &r->started_ns) && MemberUint(m, "pid", &r->pid) &&
         MemberUint(m, "stopped_ns", &r->stopped_ns, true);
}

bool ParseMembers(std::string_view json, Members* out) {
  std::vector<std::pair<std::string, std::string>> list;
  if (!JsonObjectMembers(json, &list)) return false;
  for (auto& kv : list) {
    if (!out->emplace(std::move(kv.first), std::move(kv.second)).second) return false;
  }
  return true;
}

}  // namespace

std::string FluxNamespace(const std::string& ns) { return ns.empty() ? "primary" : ns; }

bool FluxValidTopDir(const std::string& top) {
  if (top.empty() || top.size() > 64) return false;
  for (unsigned char c : top) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string FluxEscapeKey(std::string_view key) {
  if (key.empty()) return "%";
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(key.size() + 8);
  for (unsigned char c : key) {
    if (KeptInLeaf(c)) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

bool FluxUnescapeKey(std::string_view leaf, std::string* key) {
  key->clear();
  if (leaf == "%") return true;
  if (leaf.empty()) return false;
  for (size_t i = 0; i < leaf.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(leaf[i]);
    if (c == '%') {
      if (i + 2 >= leaf.size()) return false;
      const int hi = UpperHexValue(leaf[i + 1]);
      const int lo = UpperHexValue(leaf[i + 2]);
      if (hi < 0 || lo < 0) return false;
      const unsigned char b = static_cast<unsigned char>(hi * 16 + lo);
      if (KeptInLeaf(b)) return false;  // would have been written plain
      key->push_back(static_cast<char>(b));
      i += 2;
    } else if (KeptInLeaf(c)) {
      key->push_back(static_cast<char>(c));
    } else {
      return false;
    }
  }
  return true;
}

std::string FluxKeyBin(std::string_view key) {
  uint32_t h = 2166136261u;
  for (unsigned char c : key) {
    h ^= c;
    h *= 16777619u;
  }
  char buf[4];
  std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>((h ^ (h >> 16)) & 0xFF));
  return buf;
}

std::string FluxKeyPath(const std::string& top, std::string_view key) {
  return top + "." + FluxKeyBin(key) + "." + FluxEscapeKey(key);
}

std::string FluxEncodeValue(const std::string& value) {
  FileRecord rec;
  if (FileRecord::Decode(value, &rec) && rec.Encode() == value && ValidUtf8(rec.upath)) {
    JsonObjectWriter w;
    w.Str("dyad", "file")
        .Num("owner_rank", rec.owner_rank)
        .Num("owner_incarnation", rec.owner_incarnation)
        .Num("size", rec.size)
        .Num("version", rec.version)
        .Num("published_ns", rec.published_ns)
        .Str("upath", rec.upath);
    if (rec.seq != 0) w.Num("seq", rec.seq);
    return w.Take();
  }
  ServiceRecord svc;
  if (ServiceRecord::Decode(value, &svc) && svc.Encode() == value && ValidUtf8(svc.address) &&
      ValidUtf8(svc.prod_path) && ValidUtf8(svc.hostname)) {
    JsonObjectWriter w;
    w.Str("dyad", "service")
        .Num("rank", svc.rank)
        .Num("node_idx", svc.node_idx)
        .Num("incarnation", svc.incarnation)
        .Str("address", svc.address)
        .Str("prod_path", svc.prod_path)
        .Str("hostname", svc.hostname)
        .Num("started_ns", svc.started_ns)
        .Num("pid", svc.pid);
    if (svc.stopped_ns != 0) w.Num("stopped_ns", svc.stopped_ns);
    return w.Take();
  }
  JsonObjectWriter w;
  if (ValidUtf8(value)) return w.Str("dyad", "text").Str("text", value).Take();
  return w.Str("dyad", "bytes").Str("base64", Base64Encode(value)).Take();
}

bool FluxDecodeValue(std::string_view json, std::string* value, std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error) *error = why;
    return false;
  };
  Members m;
  if (!ParseMembers(json, &m)) return fail("not a JSON object");
  std::string kind;
  if (!MemberStr(m, "dyad", &kind)) return fail("no \"dyad\" member naming the value's form");
  if (kind == "text") {
    if (!MemberStr(m, "text", value)) return fail("a text value without \"text\"");
    return true;
  }
  if (kind == "bytes") {
    std::string b64;
    if (!MemberStr(m, "base64", &b64) || !Base64Decode(b64, value))
      return fail("a bytes value without valid \"base64\"");
    return true;
  }
  if (kind == "file") {
    FileRecord rec;
    if (!FileRecordFromMembers(m, &rec)) return fail("a file record with missing or bad fields");
    *value = rec.Encode();
    return true;
  }
  if (kind == "service") {
    ServiceRecord svc;
    if (!ServiceRecordFromMembers(m, &svc))
      return fail("a service record with missing or bad fields");
    *value = svc.Encode();
    return true;
  }
  return fail("unknown value form \"" + kind + "\"");
}

bool FluxDecodeFileRecord(std::string_view json, FileRecord* out) {
  std::string bytes;
  return FluxDecodeValue(json, &bytes) && FileRecord::Decode(bytes, out);
}

bool JsonObjectMembers(std::string_view json,
                       std::vector<std::pair<std::string, std::string>>* out) {
  out->clear();
  size_t i = 0;
  SkipSpace(json, &i);
  if (i >= json.size() || json[i] != '{') return false;
  ++i;
  SkipSpace(json, &i);
  if (i < json.size() && json[i] == '}') {
    ++i;
  } else {
    while (true) {
      SkipSpace(json, &i);
      std::string name;
      if (!ParseString(json, &i, &name)) return false;
      SkipSpace(json, &i);
      if (i >= json.size() || json[i] != ':') return false;
      ++i;
      SkipSpace(json, &i);
      const size_t start = i;
      if (!SkipValue(json, &i, 1)) return false;
      out->emplace_back(std::move(name), std::string(json.substr(start, i - start)));
      SkipSpace(json, &i);
      if (i >= json.size()) return false;
      if (json[i] == ',') {
        ++i;
        continue;
      }
      if (json[i] != '}') return false;
      ++i;
      break;
    }
  }
  SkipSpace(json, &i);
  return i == json.size();
}

bool JsonStringValue(std::string_view json, std::string* out) {
  out->clear();
  size_t i = 0;
  SkipSpace(json, &i);
  if (!ParseString(json, &i, out)) return false;
  SkipSpace(json, &i);
  return i == json.size();
}

std::string JsonQuote(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out.push_back(kHex[c >> 4]);
          out.push_back(kHex[c & 0xF]);
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string Base64Encode(std::string_view bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                       (static_cast<uint8_t>(bytes[i + 1]) << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (rest == 2) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

bool Base64Decode(std::string_view text, std::string* bytes) {
  bytes->clear();
  if (text.size() % 4 != 0) return false;
  bytes->reserve(text.size() / 4 * 3);
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++pad;
        continue;
      }
      if (pad > 0) return false;  // data after padding
      v[k] = value(c);
      if (v[k] < 0) return false;
    }
    const uint32_t n = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    bytes->push_back(static_cast<char>((n >> 16) & 0xFF));
    if (pad < 2) bytes->push_back(static_cast<char>((n >> 8) & 0xFF));
    if (pad < 1) bytes->push_back(static_cast<char>(n & 0xFF));
  }
  return true;
}

}  // namespace dyad
