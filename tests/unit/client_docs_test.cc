// Keeps docs/configuration.md in step with the configuration table: every
// entry of ConfigTable() must appear there as the row `dyad info --markdown`
// prints (same format as tools/dyad/commands.cc), and no other DYAD_ row.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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
      std::filesystem::path(__FILE__).parent_path().parent_path().parent_path() / "docs" /
      "configuration.md";
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

}  // namespace
}  // namespace dyad
