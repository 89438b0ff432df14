// Fuzz target: one protocol message decoder of proto/protocol.h, chosen at
// compile time (DYAD_FUZZ_MESSAGE_<name>; tests/fuzz/CMakeLists.txt builds
// one target per message). Every input either fails to decode or decodes
// to a message whose encoding decodes again to the same encoding.
#include <cstdint>
#include <string>

#include "common/wire.h"
#include "fuzz/fuzz_util.h"
#include "proto/protocol.h"

using namespace dyad;
using dyad::fuzz::Check;

namespace {

// Messages with EncodeTo(Encoder&) / DecodeFrom(Decoder&).
template <typename M>
void Streamed(const std::string& in) {
  M m;
  Decoder d(in);
  if (!m.DecodeFrom(d)) return;
  Encoder e;
  m.EncodeTo(e);
  M again;
  Decoder d2(e.data());
  Check(again.DecodeFrom(d2) && d2.done());
  Encoder e2;
  again.EncodeTo(e2);
  Check(e2.data() == e.data());
}

// Records with Encode() / static Decode(bytes, out).
template <typename R>
void Record(const std::string& in) {
  R r;
  if (!R::Decode(in, &r)) return;
  const std::string bytes = r.Encode();
  R again;
  Check(R::Decode(bytes, &again));
  Check(again.Encode() == bytes);
}

void Reply(const std::string& in) {
  Status st;
  std::string body;
  if (!DecodeReply(in, &st, &body)) return;
  const std::string bytes = EncodeReply(st, body);
  Status st2;
  std::string body2;
  Check(DecodeReply(bytes, &st2, &body2));
  Check(st2.code() == st.code() && st2.message() == st.message() && body2 == body);
  (void)MsgTypeName(static_cast<uint16_t>(st.code()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string in(reinterpret_cast<const char*>(data), size);
#if defined(DYAD_FUZZ_MESSAGE_file_record)
  Record<FileRecord>(in);
#elif defined(DYAD_FUZZ_MESSAGE_service_record)
  Record<ServiceRecord>(in);
#elif defined(DYAD_FUZZ_MESSAGE_reply)
  Reply(in);
#elif defined(DYAD_FUZZ_MESSAGE_publish_request)
  Streamed<PublishRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_locate_request)
  Streamed<LocateRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_consume_request)
  Streamed<ConsumeRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_consume_reply)
  Streamed<ConsumeReply>(in);
#elif defined(DYAD_FUZZ_MESSAGE_list_request)
  Streamed<ListRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_remove_request)
  Streamed<RemoveRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_status_reply)
  Streamed<StatusReply>(in);
#elif defined(DYAD_FUZZ_MESSAGE_kvs_request)
  Streamed<KvsRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_kvs_multi_get_request)
  Streamed<KvsMultiGetRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_fetch_request)
  Streamed<FetchRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_fetch_reply)
  Streamed<FetchReply>(in);
#elif defined(DYAD_FUZZ_MESSAGE_fetch_batch_request)
  Streamed<FetchBatchRequest>(in);
#elif defined(DYAD_FUZZ_MESSAGE_fetch_batch_part)
  Streamed<FetchBatchPart>(in);
#else
#error "define DYAD_FUZZ_MESSAGE_<message>"
#endif
  return 0;
}
