#include "common/safety.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include "common/log.h"

namespace dyad {

Status CheckListenPolicy(const SocketAddress& listen, bool has_credential, bool insecure) {
  if (has_credential) return Status::OK();
  Result<bool> loopback = IsLoopbackAddress(listen);
  if (!loopback.ok()) return loopback.status().Annotate("--listen");
  const std::string who = *loopback ? "any process of any user on this host"
                                    : "any process that can reach " + listen.ToString();
  const std::string risk = "without a credential " + who +
                           " can fetch any file of the producer directory, published or not, "
                           "and read and write the metadata store";
  if (!insecure)
    return Status(DYAD_RC_PERM, "refusing to listen on " + listen.ToString() +
                                    " without a credential: " + risk +
                                    ". Give the services a cluster secret (`dyad secret init "
                                    "FILE`, then --secret-file FILE or DYAD_SECRET_FILE) or MUNGE "
                                    "(--munge), or pass --insecure to accept that risk");
  DYAD_LOG_WARN("running --insecure on %s: %s", listen.ToString().c_str(), risk.c_str());
  return Status::OK();
}

Status PrepareSocketDirectory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) == 0) {
    // The umask may have narrowed the mode; it can never have widened it,
    // but make the result exact anyway.
    if (::chmod(dir.c_str(), 0700) != 0)
      return StatusFromErrno(errno, "chmod socket directory '" + dir + "'");
  } else if (errno != EEXIST) {
    return StatusFromErrno(errno, "create socket directory '" + dir + "'");
  }
  // Examined through a descriptor that did not follow a symlink, so the
  // answer is about the directory itself.
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ELOOP || errno == ENOTDIR)
      return Status(DYAD_RC_PERM,
                    "socket directory '" + dir + "' is a symlink or not a directory; remove it");
    return StatusFromErrno(errno, "open socket directory '" + dir + "'");
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, "stat '" + dir + "'");
  if (st.st_uid != ::geteuid())
    return Status(DYAD_RC_PERM, "socket directory '" + dir + "' belongs to uid " +
                                    std::to_string(st.st_uid) + ", not to this service's uid " +
                                    std::to_string(::geteuid()) +
                                    "; another user could replace the socket. Remove it, or "
                                    "choose another --socket");
  if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    const std::string why = "socket directory '" + dir + "' has mode " + mode +
                            "; it must be 0700 (no access for group or others), or another "
                            "user could replace the socket. ";
    // A sticky or world-writable directory (/tmp, /var/tmp, /dev/shm) is
    // shared by design: changing its mode would break everyone else.
    if ((st.st_mode & (S_ISVTX | S_IWOTH)) != 0)
      return Status(DYAD_RC_PERM, why +
                                      "It is a shared directory: do not change its mode; put the "
                                      "socket in a private subdirectory instead, e.g. --socket " +
                                      dir + "/dyad-" + std::to_string(::geteuid()) +
                                      "/dyad.sock (created with mode 0700)");
    return Status(DYAD_RC_PERM, why +
                                    "chmod 700 it if only this service uses it, or put the "
                                    "socket in a private subdirectory");
  }
  return Status::OK();
}

}  // namespace dyad
