// fuzz_make_seeds OUT_DIR: writes valid example inputs for every fuzz
// target into OUT_DIR/<target>/, the starting point of the committed corpus
// (tests/fuzz/corpus). Each seed is what a well-behaved peer, client or
// operator would send; the fuzzers mutate from there.
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/handshake.h"
#include "common/net.h"
#include "common/wire.h"
#include "proto/protocol.h"

using namespace dyad;

namespace {

std::string g_out;

void Seed(const std::string& target, const std::string& name, const std::string& bytes) {
  const std::string dir = g_out + "/" + target;
  ::mkdir(dir.c_str(), 0755);
  std::ofstream(dir + "/seed-" + name, std::ios::binary) << bytes;
}

std::string Frame(uint16_t type, const std::string& payload) {
  char hdr[kFrameHeaderSize];
  EncodeFrameHeader(hdr, type, static_cast<uint32_t>(payload.size()));
  return std::string(hdr, sizeof hdr) + payload;
}

template <typename M>
std::string Enc(const M& m) {
  Encoder e;
  m.EncodeTo(e);
  return e.Take();
}

std::string U16(uint16_t v) { return std::string(reinterpret_cast<const char*>(&v), 2); }

FileRecord SampleRecord() {
  FileRecord r;
  r.owner_rank = 3;
  r.owner_incarnation = 0x1234567890abcdefull;
  r.size = 4096;
  r.version = 1700000000123456789ull;
  r.published_ns = 1700000000223456789ull;
  r.upath = "dir/data0.txt";
  return r;
}

void Messages() {
  Seed("fuzz_msg_file_record", "a", SampleRecord().Encode());
  ServiceRecord s;
  s.rank = 1;
  s.node_idx = 1;
  s.incarnation = 99;
  s.address = "node1:7590";
  s.prod_path = "/local/dmd";
  s.hostname = "node1";
  s.started_ns = 1700000000000000000ull;
  Seed("fuzz_msg_service_record", "a", s.Encode());
  Seed("fuzz_msg_reply", "ok", EncodeReply(Status::OK(), "body"));
  Seed("fuzz_msg_reply", "err", EncodeReply(Status(DYAD_RC_NOTFOUND, "not published")));
  PublishRequest p;
  p.ns = "ns";
  p.key = "263.2ce.2e1.1/data0.txt";
  p.upath = "1/data0.txt";
  p.prod_path = "/dmd";
  p.size = 10;
  p.version = 5;
  p.async = true;
  Seed("fuzz_msg_publish_request", "a", Enc(p));
  LocateRequest l;
  l.ns = "ns";
  l.key = p.key;
  l.wait = true;
  l.timeout_ms = 5000;
  Seed("fuzz_msg_locate_request", "a", Enc(l));
  ConsumeRequest c;
  c.ns = "ns";
  c.key = p.key;
  c.upath = p.upath;
  c.cons_path = "/cons";
  c.timeout_ms = -1;
  c.dtl_mode = "UCX";
  Seed("fuzz_msg_consume_request", "plain", Enc(c));
  c.have_record = true;
  c.record = SampleRecord();
  Seed("fuzz_msg_consume_request", "record", Enc(c));
  ConsumeReply cr;
  cr.record = SampleRecord();
  cr.transferred = true;
  cr.bytes = 4096;
  cr.transfer_ns = 1000;
  Seed("fuzz_msg_consume_reply", "a", Enc(cr));
  ListRequest li;
  li.ns = "ns";
  li.path_prefix = "dir/";
  li.limit = 10;
  Seed("fuzz_msg_list_request", "a", Enc(li));
  RemoveRequest rm;
  rm.ns = "ns";
  rm.key = p.key;
  Seed("fuzz_msg_remove_request", "a", Enc(rm));
  StatusReply st;
  st.counters["bytes.in"] = 5;
  st.counters["fetch.refused"] = 1;
  st.info["rank"] = "0";
  st.info["link_protection"] = "integrity";
  Seed("fuzz_msg_status_reply", "a", Enc(st));
  KvsRequest k;
  k.ns = "dyad.services";
  k.key = "rank.1";
  k.value = s.Encode();
  k.timeout_ms = 2000;
  k.limit = 0;
  Seed("fuzz_msg_kvs_request", "a", Enc(k));
  KvsMultiGetRequest mg;
  mg.ns = "dyad";
  mg.keys = {"263.2ce.2e1.1/data0.txt", "", "k"};
  Seed("fuzz_msg_kvs_multi_get_request", "a", Enc(mg));
  FetchRequest f;
  f.upath = "dir/data0.txt";
  f.transport = "tcp";
  f.transport_args = "";
  f.expect_version = 5;
  Seed("fuzz_msg_fetch_request", "a", Enc(f));
  FetchReply fr;
  fr.size = 4096;
  fr.version = 5;
  fr.transport_args = "/dmd/dir/data0.txt";
  Seed("fuzz_msg_fetch_reply", "a", Enc(fr));
  FetchBatchRequest fb;
  fb.max_inline = 256 << 10;
  fb.items.push_back({"dir/data0.txt", 5});
  fb.items.push_back({"dir/data1.txt", 0});
  Seed("fuzz_msg_fetch_batch_request", "a", Enc(fb));
  FetchBatchPart part;
  part.version = 5;
  part.mode = 0640;
  part.data = "0123456789abcdef";
  Seed("fuzz_msg_fetch_batch_part", "a", Enc(part));
  Seed("fuzz_msg_fetch_batch_part", "empty", Enc(FetchBatchPart()));
}

Hello SampleHello(uint8_t credentials) {
  Hello h;
  h.nonce.assign(kHandshakeNonceSize, 'n');
  h.rank = 2;
  h.incarnation = 22;
  h.credentials = credentials;
  h.protection = 1;
  // A valid X25519 public key (the base point u = 9).
  h.public_key.assign(kHandshakeKeySize, '\0');
  h.public_key[0] = 9;
  return h;
}

void Handshake() {
  ChallengeMsg c;
  c.hello = SampleHello(0);
  AuthenticateMsg a;
  a.hello = SampleHello(0);
  ServerProofMsg proof;
  Seed("fuzz_handshake", "challenge", std::string(1, 0) + c.Encode());
  AuthenticateMsg with_mac = a;
  with_mac.hello.credentials = kCredSecret;
  with_mac.mac.assign(kHandshakeMacSize, 'm');
  Seed("fuzz_handshake", "authenticate", std::string(1, 1) + with_mac.Encode());
  // Issue 25: the answer with the challenge's hash and the secret check,
  // which the accepting side uses to name why a proof fails.
  AuthenticateMsg with_checks = with_mac;
  with_checks.challenge_hash.assign(kHandshakeMacSize, 'h');
  with_checks.secret_check.assign(kHandshakeMacSize, 'c');
  Seed("fuzz_handshake", "authenticate-checks", std::string(1, 1) + with_checks.Encode());
  Seed("fuzz_handshake", "accept-secret-checks",
       std::string(1, 3) +
           Frame(static_cast<uint16_t>(MsgType::kAuthenticate), with_checks.Encode()));
  proof.mac.assign(kHandshakeMacSize, 'p');
  Seed("fuzz_handshake", "proof", std::string(1, 2) + proof.Encode());
  const uint16_t kAuth = static_cast<uint16_t>(MsgType::kAuthenticate);
  const uint16_t kChal = static_cast<uint16_t>(MsgType::kChallenge);
  const uint16_t kReply = static_cast<uint16_t>(MsgType::kReply);
  Seed("fuzz_handshake", "accept-secret", std::string(1, 3) + Frame(kAuth, with_mac.Encode()));
  Seed("fuzz_handshake", "accept-none", std::string(1, 4) + Frame(kAuth, a.Encode()));
  ChallengeMsg secret_c = c;
  secret_c.hello.credentials = kCredSecret;
  Seed("fuzz_handshake", "connect-secret",
       std::string(1, 5) + Frame(kChal, secret_c.Encode()) +
           Frame(kReply, EncodeReply(Status::OK(), proof.Encode())));
  Seed("fuzz_handshake", "connect-none",
       std::string(1, 6) + Frame(kChal, c.Encode()) +
           Frame(kReply, EncodeReply(Status::OK(), ServerProofMsg().Encode())));
  Seed("fuzz_handshake", "connect-refused",
       std::string(1, 6) + Frame(kChal, c.Encode()) +
           Frame(kReply, EncodeReply(Status(DYAD_RC_AUTH, "refused"))));
}

void Frames() {
  const uint16_t kChal = static_cast<uint16_t>(MsgType::kChallenge);
  Seed("fuzz_frame_reader", "unauth", std::string(1, 0) + Frame(kChal, "0123456789"));
  Seed("fuzz_frame_reader", "local",
       std::string(1, 1) + Frame(12, "abc") + Frame(13, std::string(5000, 'z')));
  Seed("fuzz_frame_reader", "authenticated", std::string(1, 2) + Frame(50, "fetch") + Frame(1, ""));
  Seed("fuzz_frame_reader", "sealed-garbage", std::string(1, 3) + Frame(50, std::string(40, 'g')));
  // Structured: (u16 type, u16 len, bytes)... and a trailing flip byte.
  const std::string frames = U16(50) + U16(5) + "hello" + U16(51) + U16(3) + "abc";
  Seed("fuzz_frame_reader", "structured-integrity", std::string(1, 5) + frames);
  Seed("fuzz_frame_reader", "structured-encrypt", std::string(1, 6) + frames);
  Seed("fuzz_frame_reader", "structured-flip", std::string(1, 5) + frames + "\x21");
  Seed("fuzz_frame_reader", "streamed-integrity", std::string(1, 7) + frames);
  Seed("fuzz_frame_reader", "streamed-encrypt", std::string(1, 8) + frames + "\x05");
  Seed("fuzz_frame_reader", "now-integrity", std::string(1, 9) + frames);
  Seed("fuzz_frame_reader", "now-encrypt-flip", std::string(1, 10) + frames + "\x13");
}

std::string KvsOp(MsgType type, const KvsRequest& r) {
  const std::string payload = Enc(r);
  return U16(static_cast<uint16_t>(type)) + U16(static_cast<uint16_t>(payload.size())) + payload;
}

void KvsServer() {
  KvsRequest put;
  put.ns = "ns";
  put.key = "k";
  put.value = SampleRecord().Encode();
  KvsRequest get = put;
  get.value.clear();
  KvsRequest list;
  list.ns = "ns";
  list.key = "";
  list.limit = 5;
  KvsRequest wait = get;
  wait.timeout_ms = 10;
  Seed("fuzz_kvs_server", "put-get-list-remove",
       KvsOp(MsgType::kKvsPut, put) + KvsOp(MsgType::kKvsGet, get) +
           KvsOp(MsgType::kKvsList, list) + KvsOp(MsgType::kKvsRemove, get) +
           KvsOp(MsgType::kKvsWait, wait));
  Seed("fuzz_kvs_server", "bad-type", U16(50) + U16(3) + "xyz");
  KvsMultiGetRequest mg;
  mg.ns = "ns";
  mg.keys = {"k", "key", "missing", "key2"};
  const std::string payload = Enc(mg);
  Seed("fuzz_kvs_server", "multi-get",
       KvsOp(MsgType::kKvsPut, put) + U16(static_cast<uint16_t>(MsgType::kKvsMultiGet)) +
           U16(static_cast<uint16_t>(payload.size())) + payload);
}

void Text() {
  const std::vector<std::pair<char, std::string>> config = {
      {0, "true"},      {0, "off"},     {1, "42"},    {1, "18446744073709551615"},
      {2, "2.5"},       {2, "inf"},     {2, "1e300"}, {3, "encrypt"},
      {3, "Integrity"}, {4, "DYAD_KVS"}};
  int i = 0;
  for (const auto& [mode, value] : config)
    Seed("fuzz_config", std::to_string(i++), std::string(1, mode) + value);
  i = 0;
  for (const char* a : {"127.0.0.1:7590", "unix:/tmp/dyad-0/service.sock", "/tmp/s.sock",
                        "node-1.cluster:0", "[::1]:80"})
    Seed("fuzz_address", std::to_string(i++), a);
  i = 0;
  for (const char* u : {"redis://127.0.0.1:6379", "redis://user:p%40ss@db.example:6380/3",
                        "redis://:pw@[::1]:7000/0?timeout_ms=500&connect_timeout_ms=100&prefix=x",
                        "redis://h?password_file=/run/secret", "rediss://h:1"})
    Seed("fuzz_redis_url", std::to_string(i++), u);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
    return 2;
  }
  g_out = argv[1];
  ::mkdir(g_out.c_str(), 0755);
  Messages();
  Handshake();
  Frames();
  KvsServer();
  Text();
  return 0;
}
