// c_client.cc: the producer/consumer calls of the C API
// (dyad/client/dyad_client.h), in libdyad_client, on top of the public C++
// client of libdyad_ctx (dyad/client/dyad_client.hpp): the client of the
// process's context, and SetLastError for dyad_last_error().
//
// Upstream semantics kept: a path outside the managed directory is not an
// error (DYAD_RC_OK, nothing done), and dyad_consume_w_metadata with NULL
// metadata assumes the file is local. A context initialized without any
// managed directory does nothing and succeeds.
#include <cstdlib>
#include <cstring>
#include <string>

#include "client/c_guard.h"
#include "dyad/client/dyad_client.h"
#include "dyad/client/dyad_client.hpp"

using dyad::capi::Guard;
using dyad::client::Client;
using dyad::client::Metadata;
using dyad::client::SetLastError;
using dyad::client::Side;
using dyad::client::Status;

namespace {

dyad_rc_t Fail(dyad_rc_t code, const std::string& message) {
  return SetLastError(Status(code, message));
}

// Untracked paths succeed silently (upstream); anything else is recorded.
dyad_rc_t Finish(const Status& st) {
  if (st.ok() || st.code() == DYAD_RC_UNTRACKED) return DYAD_RC_OK;
  return SetLastError(st);
}

// True when the context was initialized without any managed directory:
// DYAD then does nothing at all, and every call succeeds.
bool Inert(const Client& c) { return !c.has_producer_path() && !c.has_consumer_path(); }

}  // namespace

extern "C" {

dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname) {
  return Guard("dyad_produce", [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_produce: fname is NULL");
    if (Inert(client)) return DYAD_RC_OK;
    return Finish(client.Produce(fname));
  });
}

dyad_rc_t dyad_consume(dyad_ctx_t* ctx, const char* fname) {
  return Guard("dyad_consume", [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume: fname is NULL");
    if (Inert(client)) return DYAD_RC_OK;
    return Finish(client.Consume(fname));
  });
}

dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                            dyad_metadata_t** mdata) {
  return Guard("dyad_get_metadata", [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_get_metadata: fname is NULL");
    if (mdata == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_get_metadata: mdata is NULL");
    if (Inert(client)) return DYAD_RC_OK;
    std::string upath;
    st = client.Resolve(fname, Side::kConsumer, &upath);
    // Outside the consumer directory: nothing to describe, *mdata untouched
    // (upstream), and dyad_consume_w_metadata(NULL) then does nothing.
    if (st.code() == DYAD_RC_UNTRACKED) return DYAD_RC_OK;
    Metadata rec;
    st = client.GetMetadata(fname, should_wait, &rec);
    if (!st.ok()) return SetLastError(st);

    char* fpath = ::strdup(upath.c_str());
    if (fpath == nullptr) return Fail(DYAD_RC_SYSFAIL, "dyad_get_metadata: out of memory");
    // As upstream, an object passed in is reused rather than leaked.
    dyad_metadata_t* md = *mdata;
    if (md == nullptr) {
      md = static_cast<dyad_metadata_t*>(std::malloc(sizeof(dyad_metadata_t)));
      if (md == nullptr) {
        std::free(fpath);
        return Fail(DYAD_RC_SYSFAIL, "dyad_get_metadata: out of memory");
      }
    } else {
      std::free(md->fpath);
    }
    md->fpath = fpath;
    md->owner_rank = rec.owner_rank;
    md->size = rec.size;
    md->version = rec.version;
    *mdata = md;
    return DYAD_RC_OK;
  });
}

dyad_rc_t dyad_free_metadata(dyad_metadata_t** mdata) {
  if (mdata == nullptr || *mdata == nullptr) return DYAD_RC_OK;
  std::free((*mdata)->fpath);
  std::free(*mdata);
  *mdata = nullptr;
  return DYAD_RC_OK;
}

dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t* ctx, const char* fname,
                                  const dyad_metadata_t* mdata) {
  return Guard("dyad_consume_w_metadata", [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume_w_metadata: fname is NULL");
    if (mdata == nullptr || Inert(client)) return DYAD_RC_OK;  // upstream: file assumed local
    Metadata rec;
    rec.owner_rank = mdata->owner_rank;
    rec.size = mdata->size;
    rec.version = mdata->version;
    if (mdata->fpath != nullptr) rec.path = mdata->fpath;
    return Finish(client.ConsumeWithMetadata(fname, rec));
  });
}

}  // extern "C"
