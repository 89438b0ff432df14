#include "common/backend.h"

#include <algorithm>
#include <cctype>

namespace dyad {

// The rows CMake found, one DYAD_BACKEND_ROW(kind, name) per backend folder
// (cmake/DyadBackend.cmake writes the file; each row.cc defines its row as a
// function-local static, so no static-initialization order can see it half
// built, e.g. from the preload library's constructor).
#define DYAD_BACKEND_ROW(kind, name) const BackendRow& BackendRow_##name();
#include "dyad_backend_rows.inc"
#undef DYAD_BACKEND_ROW

namespace {

std::string Upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return s;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string Joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string NotBuiltReason(const BackendRow& row) {
  std::string why = std::string(row.name) + " is not compiled into this build";
  if (*row.build_switch != '\0') {
    why += std::string(" (rebuild with -D") + row.build_switch + "=ON";
    if (*row.needs != '\0') why += std::string(" and ") + row.needs + " installed";
    why += ")";
  }
  return why;
}

std::string BuiltModes() {
  std::vector<std::string> modes;
  for (const BackendRow* row : RowsOf(BackendKind::kTransport))
    if (row->built)
      for (const char* s : row->selectors) modes.push_back(s);
  return Joined(modes);
}

bool UrlMatches(const std::string& url, const std::string& selector) {
  const bool scheme = selector.size() > 3 && selector.compare(selector.size() - 3, 3, "://") == 0;
  return scheme ? url.rfind(selector, 0) == 0 : url == selector;
}

}  // namespace

const std::vector<const BackendRow*>& BackendRows() {
  static const std::vector<const BackendRow*> rows = [] {
    std::vector<const BackendRow*> all = {
#define DYAD_BACKEND_ROW(kind, name) &BackendRow_##name(),
#include "dyad_backend_rows.inc"
#undef DYAD_BACKEND_ROW
    };
    std::stable_partition(all.begin(), all.end(),
                          [](const BackendRow* r) { return r->kind == BackendKind::kTransport; });
    return all;
  }();
  return rows;
}

std::vector<const BackendRow*> RowsOf(BackendKind kind) {
  std::vector<const BackendRow*> out;
  for (const BackendRow* row : BackendRows())
    if (row->kind == kind) out.push_back(row);
  return out;
}

std::vector<std::string> BuiltNames(BackendKind kind) {
  std::vector<std::string> out;
  for (const BackendRow* row : RowsOf(kind))
    if (row->built) out.emplace_back(row->name);
  return out;
}

const BackendRow* FindRow(BackendKind kind, const std::string& name) {
  for (const BackendRow* row : RowsOf(kind))
    if (name == row->name) return row;
  return nullptr;
}

std::string DefaultDtlMode() { return FindConfigEntry("DYAD_DTL_MODE")->default_value; }

Result<const BackendRow*> TransportRowForMode(const std::string& mode, bool require_built) {
  const std::string want = Upper(mode.empty() ? DefaultDtlMode() : mode);
  for (const BackendRow* row : RowsOf(BackendKind::kTransport)) {
    bool match = Lower(want) == row->name;
    for (const char* s : row->selectors) match = match || want == s;
    bool alias = false;
    for (const char* a : row->aliases) alias = alias || want == a;
    if (!match && !alias) continue;
    if (require_built && !row->built) {
      const std::string what =
          alias ? "DTL mode " + want + " maps to the " + row->selectors.front() + " transport, and "
                : "DTL mode " + want + ": ";
      return Status(DYAD_RC_BADDTLMODE,
                    what + NotBuiltReason(*row) + "; available here: " + BuiltModes());
    }
    return row;
  }
  return Status(DYAD_RC_BADDTLMODE,
                "unknown DTL mode '" + mode + "' (available here: " + BuiltModes() + ")");
}

Result<std::string> CanonicalDtlMode(const std::string& mode) {
  Result<const BackendRow*> row = TransportRowForMode(mode, false);
  if (!row.ok()) return row.status();
  const std::string want = Upper(mode.empty() ? DefaultDtlMode() : mode);
  for (const char* s : (*row)->selectors)
    if (want == s) return std::string(s);
  return std::string((*row)->selectors.front());  // an alias or the row's name
}

std::vector<std::string> AllDtlModes() {
  std::vector<std::string> out;
  for (const BackendRow* row : RowsOf(BackendKind::kTransport)) {
    for (const char* s : row->selectors) out.emplace_back(s);
    for (const char* a : row->aliases) out.emplace_back(a);
  }
  return out;
}

Result<const BackendRow*> StoreRowForUrl(const std::string& url, bool require_built) {
  std::vector<std::string> forms;
  for (const BackendRow* row : RowsOf(BackendKind::kStore)) {
    for (const char* s : row->selectors) {
      if (row->built) forms.emplace_back(s);
      if (!UrlMatches(url, s)) continue;
      if (require_built && !row->built)
        return Status(DYAD_RC_NOTSUP, "metadata store '" + url + "': " + NotBuiltReason(*row));
      return row;
    }
  }
  return Status(DYAD_RC_NOTSUP,
                "unknown metadata store '" + url + "' (available here: " + Joined(forms) + ")");
}

std::string CapsText(const BackendRow& row) {
  std::vector<std::string> on;
  if (row.kind == BackendKind::kTransport) {
    const TransportCaps& c = row.transport_caps;
    if (c.data_on_session) on.emplace_back("data_on_session");
    if (c.zero_copy_send) on.emplace_back("zero_copy_send");
    if (c.rma_put) on.emplace_back("rma_put");
    if (c.rma_get) on.emplace_back("rma_get");
    if (c.needs_registration) on.emplace_back("needs_registration");
    if (c.same_node_only) on.emplace_back("same_node_only");
  } else {
    const KvsCaps& c = row.store_caps;
    if (c.persistent) on.emplace_back("persistent");
    if (c.shared) on.emplace_back("shared");
    if (c.native_wait) on.emplace_back("native_wait");
    if (c.hosted_by_service) on.emplace_back("hosted_by_service");
    if (c.async_wait) on.emplace_back("async_wait");
    if (c.watch) on.emplace_back("watch");
  }
  return on.empty() ? std::string("-") : Joined(on);
}

std::string BackendTableMarkdown(BackendKind kind) {
  const bool transport = kind == BackendKind::kTransport;
  std::string out = transport
                        ? "| transport | DTL modes | capabilities | build switch | what it does |\n"
                        : "| store | URL forms | capabilities | build switch | what it does |\n";
  out += "| --- | --- | --- | --- | --- |\n";
  for (const BackendRow* row : RowsOf(kind)) {
    std::vector<std::string> sel(row->selectors.begin(), row->selectors.end());
    for (const char* a : row->aliases) sel.push_back(std::string(a) + " (alias)");
    for (std::string& s : sel) s = "`" + s + "`";
    const std::string sw = *row->build_switch != '\0'
                               ? std::string("`") + row->build_switch + "` (" + row->needs + ")"
                               : std::string("always");
    out += std::string("| `") + row->name + "` | " + Joined(sel) + " | " + CapsText(*row) + " | " +
           sw + " | " + row->summary + " |\n";
  }
  return out;
}

}  // namespace dyad
