// libfabric, opened when the first OFI transport is made rather than when
// the program starts.
//
// Debian's libfabric links the PSM libraries, whose constructors pin the
// process to one CPU and sleep about 100 ms each while they time it: linked
// directly, every start of `dyad`, `dyad-service` and every tool cost
// 200 ms, whichever transport it used. The transport calls only five
// functions of the library itself (everything else in rdma/fabric.h goes
// through the objects' operation tables), so this file defines those five
// and forwards them to the library opened with dlopen on first use, bound to
// the symbol versions a direct link would have bound (found by CMake in the
// library at configure time). The definitions are hidden: they are never
// exported, so libfabric's own calls still reach libfabric.

#include <dlfcn.h>
#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <string>

#include "common/status.h"
#include "transport/ofi/ofi_provider.h"

#ifndef DYAD_OFI_SONAME
#define DYAD_OFI_SONAME "libfabric.so.1"
#endif
#define DYAD_OFI_HIDDEN __attribute__((visibility("hidden")))

namespace dyad {
namespace {

struct Library {
  void* handle = nullptr;
  std::string error;  // why it could not be opened; empty once open
  int (*getinfo)(uint32_t, const char*, const char*, uint64_t, const fi_info*, fi_info**) = nullptr;
  void (*freeinfo)(fi_info*) = nullptr;
  fi_info* (*dupinfo)(const fi_info*) = nullptr;
  int (*fabric)(fi_fabric_attr*, fid_fabric**, void*) = nullptr;
  const char* (*strerror)(int) = nullptr;
};

// One symbol at the version a direct link binds ("" when CMake could not
// tell: the library's default).
void* Symbol(void* handle, const char* name, const char* version, std::string* error) {
  void* p = version[0] != '\0' ? dlvsym(handle, name, version) : dlsym(handle, name);
  if (p == nullptr && error->empty())
    *error = std::string(name) + (version[0] != '\0' ? std::string("@") + version : "") +
             " is missing from " DYAD_OFI_SONAME;
  return p;
}

Library Open() {
  Library lib;
  // The plain name first, so LD_LIBRARY_PATH and the system's paths choose,
  // as they did for a direct link; then the directory the build found.
  void* h = dlopen(DYAD_OFI_SONAME, RTLD_NOW | RTLD_LOCAL);
#ifdef DYAD_OFI_LIBDIR
  if (h == nullptr) h = dlopen(DYAD_OFI_LIBDIR "/" DYAD_OFI_SONAME, RTLD_NOW | RTLD_LOCAL);
#endif
  if (h == nullptr) {
    const char* why = dlerror();
    lib.error = "cannot load " DYAD_OFI_SONAME " (" + std::string(why ? why : "not found") +
                "); install libfabric or put its directory on LD_LIBRARY_PATH";
    return lib;
  }
  std::string error;
  lib.getinfo = reinterpret_cast<decltype(lib.getinfo)>(
      Symbol(h, "fi_getinfo", DYAD_FI_GETINFO_VERSION, &error));
  lib.freeinfo = reinterpret_cast<decltype(lib.freeinfo)>(
      Symbol(h, "fi_freeinfo", DYAD_FI_FREEINFO_VERSION, &error));
  lib.dupinfo = reinterpret_cast<decltype(lib.dupinfo)>(
      Symbol(h, "fi_dupinfo", DYAD_FI_DUPINFO_VERSION, &error));
  lib.fabric = reinterpret_cast<decltype(lib.fabric)>(
      Symbol(h, "fi_fabric", DYAD_FI_FABRIC_VERSION, &error));
  lib.strerror = reinterpret_cast<decltype(lib.strerror)>(
      Symbol(h, "fi_strerror", DYAD_FI_STRERROR_VERSION, &error));
  if (!error.empty()) {
    dlclose(h);
    return Library{nullptr, error};
  }
  lib.handle = h;  // kept open for the life of the process
  return lib;
}

const Library& Lib() {
  static const Library lib = Open();
  return lib;
}

}  // namespace

Status LoadOfiLibrary() {
  const Library& lib = Lib();
  if (lib.handle == nullptr) return Status(DYAD_RC_MARGOINIT_FAIL, "ofi: " + lib.error);
  return Status::OK();
}

}  // namespace dyad

// The five entry points, as rdma/fabric.h declares them. Before
// LoadOfiLibrary has succeeded they fail the way the library reports a
// missing provider; the transport calls LoadOfiLibrary first.
extern "C" {

DYAD_OFI_HIDDEN int fi_getinfo(uint32_t version, const char* node, const char* service,
                               uint64_t flags, const struct fi_info* hints, struct fi_info** info) {
  const dyad::Library& lib = dyad::Lib();
  if (lib.getinfo == nullptr) return -FI_ENOSYS;
  return lib.getinfo(version, node, service, flags, hints, info);
}

DYAD_OFI_HIDDEN void fi_freeinfo(struct fi_info* info) {
  const dyad::Library& lib = dyad::Lib();
  if (lib.freeinfo != nullptr) lib.freeinfo(info);
}

DYAD_OFI_HIDDEN struct fi_info* fi_dupinfo(const struct fi_info* info) {
  const dyad::Library& lib = dyad::Lib();
  return lib.dupinfo != nullptr ? lib.dupinfo(info) : nullptr;
}

DYAD_OFI_HIDDEN int fi_fabric(struct fi_fabric_attr* attr, struct fid_fabric** fabric,
                              void* context) {
  const dyad::Library& lib = dyad::Lib();
  if (lib.fabric == nullptr) return -FI_ENOSYS;
  return lib.fabric(attr, fabric, context);
}

DYAD_OFI_HIDDEN const char* fi_strerror(int errnum) {
  const dyad::Library& lib = dyad::Lib();
  if (lib.strerror != nullptr) return lib.strerror(errnum);
  return errnum == FI_ENOSYS ? "libfabric is not loaded" : "libfabric error";
}

}  // extern "C"
