// pydyad's DTLMode enum is written by hand (python/pydyad/bindings.py, with
// upstream's member names); this keeps it in step with the transport rows.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "common/backend.h"

namespace {

// Member name -> value of every `DYAD_DTL_X = "Y"` line of the enum.
std::map<std::string, std::string> PydyadDtlModes() {
  std::ifstream in(std::string(DYAD_SOURCE_DIR) + "/python/pydyad/bindings.py");
  std::stringstream text;
  text << in.rdbuf();
  const std::string s = text.str();
  std::map<std::string, std::string> out;
  const std::regex member(R"re(\n\s+DYAD_DTL_([A-Z0-9_]+)\s*=\s*"([A-Za-z0-9_]+)")re");
  for (std::sregex_iterator it(s.begin(), s.end(), member), end; it != end; ++it)
    out[(*it)[1].str()] = (*it)[2].str();
  return out;
}

TEST(BackendRows, PydyadDtlModeNamesEveryModeOfTheRows) {
  const auto py = PydyadDtlModes();
  ASSERT_FALSE(py.empty()) << "no DYAD_DTL_ members found in bindings.py";
  for (const std::string& mode : dyad::AllDtlModes()) {
    SCOPED_TRACE(mode);
    const auto it = py.find(mode);
    ASSERT_NE(it, py.end()) << "pydyad.DTLMode has no DYAD_DTL_" << mode;
    const auto want = dyad::CanonicalDtlMode(mode);
    const auto got = dyad::CanonicalDtlMode(it->second);
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(*got, *want) << "DYAD_DTL_" << mode << " = \"" << it->second << "\"";
  }
}

TEST(BackendRows, EveryPydyadDtlModeValueIsAModeOfTheRows) {
  for (const auto& [name, value] : PydyadDtlModes()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(dyad::CanonicalDtlMode(value).ok()) << value;
  }
}

}  // namespace
