// Keeps docs/configuration.md in step with the configuration table: every
// entry of ConfigTable() must appear there as the row `dyad info --markdown`
// prints (same format as tools/dyad/commands.cc), and no other DYAD_ row.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "common/backend.h"
#include "common/config.h"

namespace dyad {
namespace {

std::string Row(const ConfigEntry& e) {
  std::string def = *e.default_value ? std::string("`") + e.default_value + "`" : "(unset)";
  return std::string("| `") + e.name + "` | " + ConfigKindName(e.kind) + " | " + def + " | " +
         e.used_by + " | " + e.help + " |";
}

TEST(ConfigurationDoc, MirrorsTheConfigTable) {
  const std::filesystem::path doc =
      std::filesystem::path(DYAD_SOURCE_DIR) / "docs" / "configuration.md";
  std::ifstream in(doc);
  if (!in) GTEST_SKIP() << doc << " not found (out-of-tree sources?)";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  size_t rows = 0;
  for (const ConfigEntry& e : ConfigTable()) {
    EXPECT_NE(text.find(Row(e) + "\n"), std::string::npos)
        << "docs/configuration.md is out of date for " << e.name
        << "; regenerate the table with `dyad info --markdown`";
    ++rows;
  }
  size_t doc_rows = 0;
  for (size_t pos = 0; (pos = text.find("\n| `DYAD_", pos)) != std::string::npos; ++pos) ++doc_rows;
  EXPECT_EQ(doc_rows, rows) << "docs/configuration.md lists variables the table does not have";
}

// The backend tables are generated from the rows too.
TEST(ConfigurationDoc, ListsEveryBackendRow) {
  const std::filesystem::path doc =
      std::filesystem::path(DYAD_SOURCE_DIR) / "docs" / "configuration.md";
  std::ifstream in(doc);
  if (!in) GTEST_SKIP() << doc << " not found (out-of-tree sources?)";
  std::stringstream ss;
  ss << in.rdbuf();
  for (BackendKind kind : {BackendKind::kTransport, BackendKind::kStore})
    EXPECT_NE(ss.str().find(BackendTableMarkdown(kind)), std::string::npos)
        << "docs/configuration.md is out of date for the backend rows; regenerate the tables "
           "with `dyad info --markdown`";
}

// Every DYAD_ variable the sources read is in the configuration table, and
// only the table's accessors (common/config.cc) call getenv for them.
TEST(ConfigurationTable, HoldsEveryVariableTheSourcesRead) {
  const std::filesystem::path root = std::filesystem::path(DYAD_SOURCE_DIR);
  if (!std::filesystem::exists(root / "src")) GTEST_SKIP() << "sources not found";
  const std::regex read(
      R"re((getenv|GetEnv|EnvBool|EnvUint|EnvUint32|EnvTimeoutMs)\(\s*"(DYAD_[A-Z0-9_]+)")re");
  const std::regex raw(R"re(getenv\(\s*"DYAD_)re");
  size_t files = 0;
  for (const char* dir : {"src", "tools", "python/src"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".hpp") continue;
      ++files;
      std::ifstream in(entry.path());
      std::stringstream ss;
      ss << in.rdbuf();
      const std::string text = ss.str();
      const std::string rel = std::filesystem::relative(entry.path(), root).string();
      for (std::sregex_iterator it(text.begin(), text.end(), read), end; it != end; ++it)
        EXPECT_NE(FindConfigEntry((*it)[2].str()), nullptr)
            << rel << " reads " << (*it)[2].str() << ", which is not in the configuration table";
      if (rel != "src/common/config.cc") {
        EXPECT_FALSE(std::regex_search(text, raw))
            << rel << " calls getenv for a DYAD_ variable; use GetEnv/EnvBool/EnvUint";
      }
    }
  }
  EXPECT_GT(files, 20u);
}

}  // namespace
}  // namespace dyad
