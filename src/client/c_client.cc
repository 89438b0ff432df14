// c_client.cc: the producer/consumer calls of the C API
// (dyad/client/dyad_client.h), thin wrappers over dyad::Client.
//
// Upstream semantics kept: a path outside the managed directory is not an
// error (DYAD_RC_OK, nothing done), and dyad_consume_w_metadata with NULL
// metadata assumes the file is local. A context initialized without any
// managed directory does nothing and succeeds. This file uses only
// dyad::Client and the capi helpers (both in libdyad_ctx).
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "client/ctx_internal.h"
#include "dyad/client/dyad_client.h"

using dyad::Client;
using dyad::ConsumeInfo;
using dyad::FileRecord;
using dyad::Result;
using dyad::Status;
using dyad::capi::ClientOf;
using dyad::capi::Fail;
using dyad::capi::Guard;
using dyad::capi::Inert;

namespace {

// Untracked paths succeed silently (upstream); anything else is recorded.
dyad_rc_t Finish(const Status& st) {
  if (st.ok() || st.code() == DYAD_RC_UNTRACKED) return DYAD_RC_OK;
  return Fail(st);
}

// The first failure of a batch (recorded as the last error), else OK.
dyad_rc_t BatchOutcome(const std::vector<Status>& results, dyad_rc_t* rcs) {
  const Status* first = nullptr;
  for (size_t i = 0; i < results.size(); ++i) {
    const bool ok = results[i].ok() || results[i].code() == DYAD_RC_UNTRACKED;
    if (rcs != nullptr) rcs[i] = ok ? DYAD_RC_OK : results[i].code();
    if (!ok && first == nullptr) first = &results[i];
  }
  return first == nullptr ? DYAD_RC_OK : Fail(*first);
}

Status CopyNames(const char* const* fnames, size_t n, std::vector<std::string>* out) {
  if (n > 0 && fnames == nullptr) return Status(DYAD_RC_BADBUF, "fnames is NULL");
  for (size_t i = 0; i < n; ++i) {
    if (fnames[i] == nullptr)
      return Status(DYAD_RC_BADBUF, "fnames[" + std::to_string(i) + "] is NULL");
    out->emplace_back(fnames[i]);
  }
  return Status::OK();
}

dyad_rc_t Prefetch(const char* what, dyad_ctx_t* ctx, const char* pattern, bool cancel) {
  return Guard(what, [&]() -> dyad_rc_t {
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    if (pattern == nullptr) return Fail(DYAD_RC_BADBUF, std::string(what) + ": pattern is NULL");
    if (Inert(**client)) return DYAD_RC_OK;
    Result<uint32_t> n = (*client)->Prefetch(pattern, cancel);
    return n.ok() ? DYAD_RC_OK : Fail(n.status());
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

namespace dyad {
namespace capi {

dyad_rc_t ConsumeWithInfo(dyad_ctx_t* ctx, const char* fname, ConsumeInfo* info) {
  return Guard("dyad_consume", [&]() -> dyad_rc_t {
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume: fname is NULL");
    if (Inert(**client)) return DYAD_RC_OK;
    return Finish((*client)->Consume(fname, info));
  });
}

}  // namespace capi
}  // namespace dyad

extern "C" {

dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname) {
  return Guard("dyad_produce", [&]() -> dyad_rc_t {
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_produce: fname is NULL");
    if (Inert(**client)) return DYAD_RC_OK;
    return Finish((*client)->Produce(fname));
  });
}

dyad_rc_t dyad_consume(dyad_ctx_t* ctx, const char* fname) {
  return dyad::capi::ConsumeWithInfo(ctx, fname, nullptr);
}

dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                            dyad_metadata_t** mdata) {
  return Guard("dyad_get_metadata", [&]() -> dyad_rc_t {
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_get_metadata: fname is NULL");
    if (mdata == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_get_metadata: mdata is NULL");
    if (Inert(**client)) return DYAD_RC_OK;
    Result<std::string> upath = (*client)->Resolve(fname, dyad::Side::kConsumer);
    // Outside the consumer directory: nothing to describe, *mdata untouched
    // (upstream), and dyad_consume_w_metadata(NULL) then does nothing.
    if (!upath.ok() && upath.status().code() == DYAD_RC_UNTRACKED) return DYAD_RC_OK;
    Result<FileRecord> rec = (*client)->GetMetadata(fname, should_wait);
    if (!rec.ok()) return Fail(rec.status());

    char* fpath = ::strdup(upath->c_str());
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
    md->owner_rank = rec->owner_rank;
    md->size = rec->size;
    md->version = rec->version;
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
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    if (fname == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume_w_metadata: fname is NULL");
    if (mdata == nullptr || Inert(**client)) return DYAD_RC_OK;  // upstream: file assumed local
    FileRecord rec;
    rec.owner_rank = mdata->owner_rank;
    rec.size = mdata->size;
    rec.version = mdata->version;
    if (mdata->fpath != nullptr) rec.upath = mdata->fpath;
    return Finish((*client)->ConsumeWithRecord(fname, rec));
  });
}

dyad_rc_t dyad_prefetch(dyad_ctx_t* ctx, const char* pattern) {
  return Prefetch("dyad_prefetch", ctx, pattern, false);
}

dyad_rc_t dyad_prefetch_cancel(dyad_ctx_t* ctx, const char* pattern) {
  return Prefetch("dyad_prefetch_cancel", ctx, pattern, true);
}

dyad_rc_t dyad_consume_batch(dyad_ctx_t* ctx, const char* const* fnames, size_t n,
                             dyad_rc_t* rcs) {
  return Guard("dyad_consume_batch", [&]() -> dyad_rc_t {
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    std::vector<std::string> names;
    if (Status st = CopyNames(fnames, n, &names); !st.ok())
      return Fail(st.Annotate("dyad_consume_batch"));
    std::vector<Status> results(n, Status::OK());
    if (!Inert(**client)) {
      Status st = (*client)->ConsumeBatch(names, &results);
      if (!st.ok()) return Fail(st);
    }
    return BatchOutcome(results, rcs);
  });
}

dyad_rc_t dyad_consume_start(dyad_ctx_t* ctx, const char* const* fnames, size_t n,
                             dyad_consume_handle_t** handle) {
  return Guard("dyad_consume_start", [&]() -> dyad_rc_t {
    if (handle == nullptr) return Fail(DYAD_RC_BADBUF, "dyad_consume_start: handle is NULL");
    Result<std::shared_ptr<Client>> client = ClientOf(ctx);
    if (!client.ok()) return Fail(client.status());
    auto h = std::make_unique<dyad_consume_handle>();
    if (Status st = CopyNames(fnames, n, &h->names); !st.ok())
      return Fail(st.Annotate("dyad_consume_start"));
    h->results.assign(n, Status::OK());
    if (!Inert(**client)) {
      dyad_consume_handle* raw = h.get();
      // The thread keeps the client alive until the batch ends, even if the
      // context is finalized meanwhile.
      raw->thread = std::thread([raw, c = *client] {
        try {
          raw->request = c->ConsumeBatch(raw->names, &raw->results);
        } catch (...) {
          raw->request = Status(DYAD_RC_SYSFAIL, "dyad_consume_start: out of memory");
        }
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
      return Fail(h->request);
    }
    return BatchOutcome(h->results, rcs);
  });
}

}  // extern "C"
