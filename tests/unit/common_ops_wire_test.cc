// common_ops_wire_test.cc: the messages the operations features added or
// extended (consume reply with transport and owner, status with transfers,
// peers, service records with a pid) round-trip, still decode when the
// optional trailing fields are absent (older peers in this codebase), and
// reject every truncation without crashing.
#include <gtest/gtest.h>

#include "common/wire.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

template <typename T>
std::string EncodeOf(const T& m) {
  Encoder e;
  m.EncodeTo(e);
  return e.Take();
}

// Every proper prefix of `bytes` either fails to decode or decodes to
// something (a legacy form); none may crash or read past the end.
template <typename T>
void EveryPrefixIsSafe(const std::string& bytes) {
  for (size_t n = 0; n < bytes.size(); ++n) {
    T m;
    Decoder d(std::string_view(bytes.data(), n));
    (void)m.DecodeFrom(d);
  }
}

TEST(OpsWireTest, ConsumeReplyCarriesTransportAndOwnerAndDecodesWithout) {
  ConsumeReply r;
  r.record.owner_rank = 4;
  r.record.upath = "a/b";
  r.transferred = true;
  r.bytes = 99;
  r.transport = "tcp";
  r.owner_address = "10.0.0.4:7590";
  const std::string bytes = EncodeOf(r);
  ConsumeReply back;
  Decoder d(bytes);
  ASSERT_TRUE(back.DecodeFrom(d));
  EXPECT_TRUE(d.done());
  EXPECT_EQ(back.transport, "tcp");
  EXPECT_EQ(back.owner_address, "10.0.0.4:7590");
  EXPECT_EQ(back.bytes, 99u);

  // A reply of a service without the two fields.
  Encoder legacy;
  legacy.Str(r.record.Encode()).Bool(true).Bool(false).Bool(false).U64(99).U64(5);
  ConsumeReply old;
  Decoder dl(legacy.data());
  ASSERT_TRUE(old.DecodeFrom(dl));
  EXPECT_TRUE(old.transport.empty());
  EXPECT_TRUE(old.owner_address.empty());
  EveryPrefixIsSafe<ConsumeReply>(bytes);
}

TEST(OpsWireTest, StatusReplyWithAndWithoutTransfers) {
  StatusReply s;
  s.counters["transfers.in.tcp"] = 3;
  s.info["rank"] = "2";
  TransferInfo t;
  t.upath = "big.dat";
  t.peer_rank = 7;
  t.transport = "ucx";
  t.bytes_done = 10;
  t.bytes_total = 20;
  t.elapsed_ns = 30;
  s.transfers = {t, t};
  s.transfers[1].outgoing = true;
  const std::string bytes = EncodeOf(s);
  StatusReply back;
  Decoder d(bytes);
  ASSERT_TRUE(back.DecodeFrom(d));
  ASSERT_EQ(back.transfers.size(), 2u);
  EXPECT_TRUE(back.transfers[1].outgoing);
  EXPECT_EQ(back.transfers[0].upath, "big.dat");
  EXPECT_EQ(back.transfers[0].bytes_total, 20u);
  EXPECT_EQ(back.counters["transfers.in.tcp"], 3u);

  Encoder legacy;
  legacy.U32(1).Str("errors").U64(5).U32(1).Str("rank").Str("0");
  StatusReply old;
  Decoder dl(legacy.data());
  ASSERT_TRUE(old.DecodeFrom(dl));
  EXPECT_TRUE(old.transfers.empty());
  EXPECT_EQ(old.counters["errors"], 5u);
  EveryPrefixIsSafe<StatusReply>(bytes);

  // A transfer count far beyond the bytes present fails cleanly.
  Encoder lying;
  lying.U32(0).U32(0).U32(0xffffffffu);
  StatusReply bad;
  Decoder db(lying.data());
  EXPECT_FALSE(bad.DecodeFrom(db));
}

TEST(OpsWireTest, ServiceRecordPidIsOptional) {
  ServiceRecord r;
  r.rank = 3;
  r.address = "h:1";
  r.hostname = "h";
  r.pid = 4242;
  ServiceRecord back;
  ASSERT_TRUE(ServiceRecord::Decode(r.Encode(), &back));
  EXPECT_EQ(back.pid, 4242u);
  std::string legacy = r.Encode();
  legacy.resize(legacy.size() - 4);
  ASSERT_TRUE(ServiceRecord::Decode(legacy, &back));
  EXPECT_EQ(back.pid, 0u);
  EXPECT_FALSE(ServiceRecord::Decode(legacy + "xy", &back));
}

// Issue 26 item 10: a clean stop appends stopped_ns to the record; records
// without it (running services, older ones) decode as before.
TEST(OpsWireTest, ServiceRecordStoppedIsOptionalAndPeersCarryTheStoppedState) {
  ServiceRecord r;
  r.rank = 2;
  r.address = "h:1";
  r.pid = 7;
  const std::string running = r.Encode();
  r.stopped_ns = 123456789;
  const std::string stopped = r.Encode();
  EXPECT_EQ(stopped.size(), running.size() + 8);
  ServiceRecord back;
  ASSERT_TRUE(ServiceRecord::Decode(stopped, &back));
  EXPECT_EQ(back.stopped_ns, 123456789u);
  EXPECT_EQ(back.pid, 7u);
  ASSERT_TRUE(ServiceRecord::Decode(running, &back));
  EXPECT_EQ(back.stopped_ns, 0u);
  EXPECT_FALSE(ServiceRecord::Decode(stopped + "z", &back));

  PeersReply p;
  PeerInfo a;
  a.record = r;
  a.state = PeerState::kStopped;
  p.peers = {a};
  const std::string bytes = EncodeOf(p);
  PeersReply pb;
  Decoder d(bytes);
  ASSERT_TRUE(pb.DecodeFrom(d));
  ASSERT_EQ(pb.peers.size(), 1u);
  EXPECT_EQ(pb.peers[0].state, PeerState::kStopped);
  EXPECT_EQ(pb.peers[0].record.stopped_ns, 123456789u);
  EXPECT_STREQ(PeerStateName(PeerState::kStopped), "stopped");
}

TEST(OpsWireTest, PeersRequestAndReplyRoundTripAndRejectGarbage) {
  PeersRequest q;
  q.probe = false;
  q.probe_timeout_ms = 1500;
  q.ranks = {1, 5, 9};
  PeersRequest qb;
  const std::string qbytes = EncodeOf(q);
  Decoder dq(qbytes);
  ASSERT_TRUE(qb.DecodeFrom(dq));
  EXPECT_TRUE(dq.done());
  EXPECT_EQ(qb.ranks, q.ranks);
  EXPECT_FALSE(qb.probe);
  EveryPrefixIsSafe<PeersRequest>(qbytes);

  PeersReply p;
  PeerInfo a;
  a.record.rank = 1;
  a.record.address = "x:1";
  a.state = PeerState::kDown;
  a.detail = "connection refused";
  a.last_contact_ns = 77;
  p.peers = {a};
  const std::string bytes = EncodeOf(p);
  PeersReply back;
  Decoder d(bytes);
  ASSERT_TRUE(back.DecodeFrom(d));
  ASSERT_EQ(back.peers.size(), 1u);
  EXPECT_EQ(back.peers[0].state, PeerState::kDown);
  EXPECT_EQ(back.peers[0].detail, "connection refused");
  EXPECT_EQ(back.peers[0].last_contact_ns, 77u);
  EveryPrefixIsSafe<PeersReply>(bytes);
  for (size_t n = 0; n < bytes.size(); ++n) {
    PeersReply m;
    Decoder dn(std::string_view(bytes.data(), n));
    EXPECT_FALSE(m.DecodeFrom(dn) && dn.done()) << n;
  }
  // An unknown liveness state is malformed.
  std::string bad = bytes;
  const size_t state_at = 4 + 4 + a.record.Encode().size();
  bad[state_at] = 9;
  PeersReply m;
  Decoder db(bad);
  EXPECT_FALSE(m.DecodeFrom(db));
  EXPECT_STREQ(PeerStateName(PeerState::kOtherIdentity), "stale");
}

}  // namespace
}  // namespace dyad
