#include "proto/munge/munge.h"

#include <unistd.h>

#include <cstdlib>

#if DYAD_HAVE_MUNGE
#include <munge.h>
#endif

namespace dyad {

#if DYAD_HAVE_MUNGE

namespace {

// A libmunge context, destroyed with its scope.
class MungeContext {
 public:
  MungeContext() : ctx_(munge_ctx_create()) {}
  ~MungeContext() {
    if (ctx_ != nullptr) munge_ctx_destroy(ctx_);
  }
  MungeContext(const MungeContext&) = delete;
  MungeContext& operator=(const MungeContext&) = delete;
  munge_ctx_t get() const { return ctx_; }
  std::string Error(munge_err_t e) const {
    const char* detail = ctx_ != nullptr ? munge_ctx_strerror(ctx_) : nullptr;
    return detail != nullptr ? detail : munge_strerror(e);
  }

 private:
  munge_ctx_t ctx_;
};

class MungeService final : public CredentialService {
 public:
  explicit MungeService(std::string socket) : socket_(std::move(socket)) {}

  std::string name() const override { return "MUNGE"; }

  Result<std::string> Encode(std::string_view payload) const override {
    MungeContext ctx;
    DYAD_RETURN_IF_ERROR(Configure(ctx));
    // Only processes of our own uid may decode what we make.
    munge_ctx_set(ctx.get(), MUNGE_OPT_UID_RESTRICTION, ::geteuid());
    char* cred = nullptr;
    const munge_err_t e =
        munge_encode(&cred, ctx.get(), payload.data(), static_cast<int>(payload.size()));
    if (e != EMUNGE_SUCCESS) {
      std::free(cred);
      return Status(DYAD_RC_AUTH, "munge_encode via " + where() + ": " + ctx.Error(e));
    }
    std::string out(cred);
    std::free(cred);
    return out;
  }

  Result<Verified> Decode(std::string_view credential) const override {
    MungeContext ctx;
    DYAD_RETURN_IF_ERROR(Configure(ctx));
    const std::string cred(credential);  // munge wants a NUL-terminated string
    void* buf = nullptr;
    int len = 0;
    uid_t uid = 0;
    gid_t gid = 0;
    const munge_err_t e = munge_decode(cred.c_str(), ctx.get(), &buf, &len, &uid, &gid);
    Verified v;
    if (buf != nullptr && len > 0) v.payload.assign(static_cast<const char*>(buf), len);
    std::free(buf);
    if (e != EMUNGE_SUCCESS)
      return Status(DYAD_RC_AUTH, "munge_decode via " + where() + ": " + ctx.Error(e));
    v.uid = uid;
    v.gid = gid;
    return v;
  }

 private:
  Status Configure(const MungeContext& ctx) const {
    if (ctx.get() == nullptr) return Status(DYAD_RC_SYSFAIL, "cannot create a MUNGE context");
    if (!socket_.empty() &&
        munge_ctx_set(ctx.get(), MUNGE_OPT_SOCKET, socket_.c_str()) != EMUNGE_SUCCESS)
      return Status(DYAD_RC_SYSFAIL, "cannot set the MUNGE socket '" + socket_ + "'");
    return Status::OK();
  }
  std::string where() const { return socket_.empty() ? "munged" : "munged at " + socket_; }

  const std::string socket_;
};

}  // namespace

bool MungeCompiledIn() { return true; }

Result<std::shared_ptr<const CredentialService>> OpenMungeService(const std::string& socket_path) {
  auto svc = std::make_shared<MungeService>(socket_path);
  // One round trip now turns "munged is not running" into a start-up error
  // instead of a refusal of every peer later.
  Result<std::string> cred = svc->Encode("dyad-munge-probe");
  if (!cred.ok()) return cred.status().Annotate("MUNGE");
  Result<CredentialService::Verified> v = svc->Decode(*cred);
  if (!v.ok()) return v.status().Annotate("MUNGE");
  if (v->payload != "dyad-munge-probe" || v->uid != ::geteuid())
    return Status(DYAD_RC_AUTH, "MUNGE: munged returned a credential that does not round-trip");
  return std::shared_ptr<const CredentialService>(std::move(svc));
}

#else  // !DYAD_HAVE_MUNGE

bool MungeCompiledIn() { return false; }

Result<std::shared_ptr<const CredentialService>> OpenMungeService(const std::string&) {
  return Status(DYAD_RC_NOTSUP,
                "this DYAD was built without MUNGE support (install libmunge-dev and rebuild)");
}

#endif

Result<std::shared_ptr<const Authenticator>> OpenAuthenticator(const ServiceCredentials& creds) {
  AuthConfig cfg;
  cfg.secret = creds.secret;
  cfg.protection = creds.protection;
  if (creds.munge) {
    Result<std::shared_ptr<const CredentialService>> munge = OpenMungeService(creds.munge_socket);
    if (!munge.ok()) return munge.status();
    cfg.munge = std::move(*munge);
  }
  return std::make_shared<const Authenticator>(std::move(cfg));
}

}  // namespace dyad
