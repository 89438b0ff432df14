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
#include <memory>
#include <string>
#include <thread>
#include <vector>

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

// The first failure of a batch (recorded as the last error), else OK.
dyad_rc_t BatchOutcome(const std::vector<Status>& results, dyad_rc_t* rcs) {
  const Status* first = nullptr;
  for (size_t i = 0; i < results.size(); ++i) {
    const bool ok = results[i].ok() || results[i].code() == DYAD_RC_UNTRACKED;
    if (rcs != nullptr) rcs[i] = ok ? DYAD_RC_OK : results[i].code();
    if (!ok && first == nullptr) first = &results[i];
  }
  return first == nullptr ? DYAD_RC_OK : SetLastError(*first);
}

Status CopyNames(const char* what, const char* const* fnames, size_t n,
                 std::vector<std::string>* out) {
  if (n > 0 && fnames == nullptr)
    return Status(DYAD_RC_BADBUF, std::string(what) + ": fnames is NULL");
  for (size_t i = 0; i < n; ++i) {
    if (fnames[i] == nullptr)
      return Status(DYAD_RC_BADBUF,
                    std::string(what) + ": fnames[" + std::to_string(i) + "] is NULL");
    out->emplace_back(fnames[i]);
  }
  return Status();
}

dyad_rc_t Prefetch(const char* what, dyad_ctx_t* ctx, const char* pattern, bool cancel) {
  return Guard(what, [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    if (pattern == nullptr) return Fail(DYAD_RC_BADBUF, std::string(what) + ": pattern is NULL");
    if (Inert(client)) return DYAD_RC_OK;
    st = client.Prefetch(pattern, cancel);
    return st.ok() ? DYAD_RC_OK : SetLastError(st);
  });
}

}  // namespace

// A background batch (dyad_consume_start); names and results live here.
struct dyad_consume_handle {
  std::vector<std::string> names;
  std::vector<Status> results;
  Status request;
  std::thread thread;
};

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

dyad_rc_t dyad_prefetch(dyad_ctx_t* ctx, const char* pattern) {
  return Prefetch("dyad_prefetch", ctx, pattern, false);
}

dyad_rc_t dyad_prefetch_cancel(dyad_ctx_t* ctx, const char* pattern) {
  return Prefetch("dyad_prefetch_cancel", ctx, pattern, true);
}

dyad_rc_t dyad_consume_batch(dyad_ctx_t* ctx, const char* const* fnames, size_t n, dyad_rc_t* rcs) {
  return Guard("dyad_consume_batch", [&]() -> dyad_rc_t {
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    std::vector<std::string> names;
    st = CopyNames("dyad_consume_batch", fnames, n, &names);
    if (!st.ok()) return SetLastError(st);
    std::vector<Status> results(n);
    if (!Inert(client)) {
      st = client.ConsumeBatch(names, &results);
      if (!st.ok()) return SetLastError(st);
    }
    return BatchOutcome(results, rcs);
  });
}

dyad_rc_t dyad_consume_start(dyad_ctx_t* ctx, const char* const* fnames, size_t n,
                             dyad_consume_handle_t** handle) {
  return Guard("dyad_consume_start", [&]() -> dyad_rc_t {
    if (handle == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume_start: handle is NULL");
    Client client;
    Status st = Client::FromContext(ctx, &client);
    if (!st.ok()) return SetLastError(st);
    std::unique_ptr<dyad_consume_handle> h(new dyad_consume_handle);
    st = CopyNames("dyad_consume_start", fnames, n, &h->names);
    if (!st.ok()) return SetLastError(st);
    h->results.assign(n, Status());
    if (!Inert(client)) {
      dyad_consume_handle* raw = h.get();
      // The thread holds its own copy of the client (its connections), so a
      // dyad_finalize meanwhile does not end the batch.
      raw->thread = std::thread([raw, client] {
        Client c = client;
        raw->request = c.ConsumeBatch(raw->names, &raw->results);
      });
    }
    *handle = h.release();
    return DYAD_RC_OK;
  });
}

dyad_rc_t dyad_consume_wait(dyad_consume_handle_t* handle, dyad_rc_t* rcs) {
  return Guard("dyad_consume_wait", [&]() -> dyad_rc_t {
    if (handle == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume_wait: handle is NULL");
    std::unique_ptr<dyad_consume_handle> h(handle);
    if (h->thread.joinable()) h->thread.join();
    if (!h->request.ok()) {
      if (rcs != nullptr)
        for (size_t i = 0; i < h->names.size(); ++i) rcs[i] = h->request.code();
      return SetLastError(h->request);
    }
    return BatchOutcome(h->results, rcs);
  });
}

}  // extern "C"
