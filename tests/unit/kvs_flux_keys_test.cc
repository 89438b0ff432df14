// The flux:// store's key and value encoding (kvs/flux/flux_keys.h): plain
// functions, tested without a Flux instance (tests/flux/kvs_flux_test.cc
// checks the same layout inside a real KVS).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kvs/flux/flux_keys.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

size_t Dots(const std::string& s) {
  return static_cast<size_t>(std::count(s.begin(), s.end(), '.'));
}

// The paths of upstream's examples that collide when '.' is left alone.
TEST(FluxKeys, DottedPathsGetDistinctKeysAtTheSameDepth) {
  const std::vector<std::string> keys = {
      "a.b.c.file0", "a.b.c.file0.dat", "run.log", "run", "1f.2a.3b.dir/x.y", "", "%", "%2E", "."};
  std::set<std::string> paths;
  for (const std::string& k : keys) {
    const std::string p = FluxKeyPath("dyad", k);
    // dyad.<bin>.<leaf>: exactly two separators, whatever the key holds,
    // so no key's path is a directory of another's.
    EXPECT_EQ(Dots(p), 2u) << p;
    EXPECT_EQ(p.rfind("dyad.", 0), 0u) << p;
    EXPECT_TRUE(paths.insert(p).second) << "two keys share " << p;
  }
  // The layout is a format others read (clients without a service, the
  // example of docs/configuration.md): pinned.
  EXPECT_EQ(FluxKeyPath("dyad", "1a.3f.200.a.b.c.file0"),
            "dyad.36.1a%2E3f%2E200%2Ea%2Eb%2Ec%2Efile0");
  EXPECT_EQ(FluxKeyPath("dyad", "1a.3f.200.file0"), "dyad.cb.1a%2E3f%2E200%2Efile0");
  EXPECT_EQ(FluxEscapeKey("a.b.c.file0.dat"), "a%2Eb%2Ec%2Efile0%2Edat");
  EXPECT_EQ(FluxEscapeKey("run.log"), "run%2Elog");
  EXPECT_EQ(FluxEscapeKey("dir/sub-1_x:y@z+w,v=u~t"), "dir/sub-1_x:y@z+w,v=u~t");
  EXPECT_EQ(FluxEscapeKey(""), "%");
  EXPECT_EQ(FluxEscapeKey("%"), "%25");
}

TEST(FluxKeys, EscapingRoundTripsEveryByteAndNeverCollides) {
  std::mt19937 rng(27);
  std::set<std::string> leaves;
  std::set<std::string> keys;
  for (int i = 0; i < 5000; ++i) {
    std::string key(rng() % 12, '\0');
    for (char& c : key) c = static_cast<char>(rng() % 256);
    if (!keys.insert(key).second) continue;
    const std::string leaf = FluxEscapeKey(key);
    ASSERT_FALSE(leaf.empty());
    ASSERT_EQ(leaf.find('.'), std::string::npos) << leaf;
    for (unsigned char c : leaf) ASSERT_TRUE(c > 0x20 && c < 0x7F) << leaf;
    std::string back;
    ASSERT_TRUE(FluxUnescapeKey(leaf, &back)) << leaf;
    ASSERT_EQ(back, key);
    ASSERT_TRUE(leaves.insert(leaf).second) << "collision on " << leaf;
  }
  // Every single byte, NUL included.
  for (int b = 0; b < 256; ++b) {
    const std::string key(1, static_cast<char>(b));
    std::string back;
    ASSERT_TRUE(FluxUnescapeKey(FluxEscapeKey(key), &back));
    EXPECT_EQ(back, key) << b;
  }
}

TEST(FluxKeys, LeavesTheStoreDidNotWriteAreRefused) {
  std::string key;
  for (const char* bad : {"", "a.b", "%2e", "%41", "%4", "a%", "%ZZ", "sp ace", "q\"uote"})
    EXPECT_FALSE(FluxUnescapeKey(bad, &key)) << bad;
  ASSERT_TRUE(FluxUnescapeKey("%", &key));
  EXPECT_EQ(key, "");
}

TEST(FluxKeys, BinsAreTwoHexDigitsAndSpread) {
  std::set<std::string> bins;
  for (int i = 0; i < 4096; ++i) {
    const std::string b = FluxKeyBin("file" + std::to_string(i) + ".dat");
    ASSERT_EQ(b.size(), 2u);
    ASSERT_EQ(b.find_first_not_of("0123456789abcdef"), std::string::npos) << b;
    bins.insert(b);
  }
  EXPECT_GT(bins.size(), 240u);  // nearly all of the 256
}

TEST(FluxKeys, NamespacesAndTopDirectories) {
  EXPECT_EQ(FluxNamespace(""), "primary");
  EXPECT_EQ(FluxNamespace("test"), "test");
  EXPECT_EQ(FluxNamespace("dyad.services"), "dyad.services");
  EXPECT_TRUE(FluxValidTopDir("dyad"));
  EXPECT_TRUE(FluxValidTopDir("t-1_X"));
  for (const char* bad : {"", "a.b", "a b", "a/b", "%"}) EXPECT_FALSE(FluxValidTopDir(bad)) << bad;
  EXPECT_FALSE(FluxValidTopDir(std::string(65, 'a')));
}

std::string RoundTrip(const std::string& value) {
  std::string back;
  std::string why;
  EXPECT_TRUE(FluxDecodeValue(FluxEncodeValue(value), &back, &why)) << why;
  return back;
}

TEST(FluxValues, FileRecordsAreReadableJsonAndRoundTrip) {
  FileRecord r;
  r.owner_rank = 3;
  r.owner_incarnation = 0xFFFFFFFFFFFFFFFFull;
  r.size = 4096;
  r.version = 1700000000123456789ull;
  r.published_ns = 1700000000223456789ull;
  r.upath = "dir/file0.dat";
  r.seq = 7;
  const std::string json = FluxEncodeValue(r.Encode());
  EXPECT_EQ(json,
            "{\"dyad\":\"file\",\"owner_rank\":3,\"owner_incarnation\":18446744073709551615,"
            "\"size\":4096,\"version\":1700000000123456789,\"published_ns\":"
            "1700000000223456789,\"upath\":\"dir/file0.dat\",\"seq\":7}");
  EXPECT_EQ(RoundTrip(r.Encode()), r.Encode());
  FileRecord back;
  ASSERT_TRUE(FluxDecodeFileRecord(json, &back));
  EXPECT_EQ(back.owner_rank, 3u);
  EXPECT_EQ(back.upath, "dir/file0.dat");
  EXPECT_EQ(back.seq, 7u);
  // A record of an older DYAD (no seq) stays without one.
  r.seq = 0;
  EXPECT_EQ(FluxEncodeValue(r.Encode()).find("seq"), std::string::npos);
  EXPECT_EQ(RoundTrip(r.Encode()), r.Encode());
  // A path with quotes, backslashes and control bytes is escaped in JSON.
  r.upath = "we\"ird\\name\n\x01.dat";
  EXPECT_EQ(RoundTrip(r.Encode()), r.Encode());
  // A path that is not UTF-8 keeps its bytes (as base64).
  r.upath = std::string("bad\xff.dat");
  EXPECT_NE(FluxEncodeValue(r.Encode()).find("\"base64\""), std::string::npos);
  EXPECT_EQ(RoundTrip(r.Encode()), r.Encode());
}

TEST(FluxValues, ServiceRecordsTextAndBytes) {
  ServiceRecord s;
  s.rank = 1;
  s.node_idx = 1;
  s.incarnation = 42;
  s.address = "10.0.0.2:7000";
  s.prod_path = "/tmp/prod";
  s.hostname = "node2";
  s.started_ns = 5;
  s.pid = 1234;
  const std::string json = FluxEncodeValue(s.Encode());
  EXPECT_NE(json.find("\"dyad\":\"service\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"address\":\"10.0.0.2:7000\""), std::string::npos) << json;
  EXPECT_EQ(RoundTrip(s.Encode()), s.Encode());
  s.stopped_ns = 9;
  EXPECT_EQ(RoundTrip(s.Encode()), s.Encode());

  EXPECT_EQ(FluxEncodeValue("hello \"you\"\n"),
            "{\"dyad\":\"text\",\"text\":\"hello \\\"you\\\"\\n\"}");
  EXPECT_EQ(RoundTrip(""), "");
  EXPECT_EQ(RoundTrip("ünïcödé ✓"), "ünïcödé ✓");
  const std::string nul("a\0b", 3);
  EXPECT_EQ(RoundTrip(nul), nul);
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  EXPECT_NE(FluxEncodeValue(bytes).find("\"dyad\":\"bytes\""), std::string::npos);
  EXPECT_EQ(RoundTrip(bytes), bytes);
  for (size_t n = 0; n < 7; ++n)
    EXPECT_EQ(RoundTrip(bytes.substr(250 - n, n)), bytes.substr(250 - n, n));
}

TEST(FluxValues, TextsTheStoreDidNotWriteAreRefused) {
  std::string v, why;
  for (const char* bad :
       {"", "1", "\"plain\"", "{}", "{\"dyad\":\"weird\"}", "{\"dyad\":\"file\",\"owner_rank\":1}",
        "{\"dyad\":\"file\",\"owner_rank\":4294967296,\"owner_incarnation\":0,\"size\":0,"
        "\"version\":0,\"published_ns\":0,\"upath\":\"x\"}",
        "{\"dyad\":\"bytes\",\"base64\":\"abc\"}", "{\"dyad\":\"text\",\"text\":\"x\"",
        "{\"dyad\":\"text\",\"text\":\"x\",\"dyad\":\"bytes\"}", "{\"dyad\":\"text\"} trailing"}) {
    EXPECT_FALSE(FluxDecodeValue(bad, &v, &why)) << bad;
    EXPECT_FALSE(why.empty()) << bad;
  }
  FileRecord r;
  EXPECT_FALSE(FluxDecodeFileRecord("{\"dyad\":\"text\",\"text\":\"x\"}", &r));
}

TEST(FluxJson, ObjectMembersStringsAndBase64) {
  std::vector<std::pair<std::string, std::string>> m;
  ASSERT_TRUE(JsonObjectMembers(
      " {\"data\":{\"a\":{\"type\":\"val\",\"data\":\"eA==\"}},\"type\":\"dir\",\"ver\":1,"
      "\"x\":[1,-2.5e3,true,null,\"]\"]} ",
      &m));
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].first, "data");
  EXPECT_EQ(m[0].second, "{\"a\":{\"type\":\"val\",\"data\":\"eA==\"}}");
  EXPECT_EQ(m[1].second, "\"dir\"");
  EXPECT_EQ(m[2].second, "1");
  EXPECT_EQ(m[3].second, "[1,-2.5e3,true,null,\"]\"]");
  for (const char* bad : {"", "[]", "{", "{\"a\"}", "{\"a\":}", "{\"a\":1,}", "{} {}"})
    EXPECT_FALSE(JsonObjectMembers(bad, &m)) << bad;
  std::string s;
  ASSERT_TRUE(JsonStringValue("\"\\u00e9\\ud83d\\ude00\\t\\/\"", &s));
  EXPECT_EQ(s, "\xc3\xa9\xf0\x9f\x98\x80\t/");
  EXPECT_FALSE(JsonStringValue("\"\\ud83d\"", &s));  // a lone surrogate
  EXPECT_FALSE(JsonStringValue("\"raw\ncontrol\"", &s));
  EXPECT_EQ(Base64Encode("x"), "eA==");
  EXPECT_EQ(Base64Encode("xy"), "eHk=");
  EXPECT_EQ(Base64Encode("xyz"), "eHl6");
  std::string b;
  EXPECT_FALSE(Base64Decode("eA=a", &b));
  EXPECT_FALSE(Base64Decode("e===", &b));
  EXPECT_FALSE(Base64Decode("eA!=", &b));
}

}  // namespace
}  // namespace dyad
