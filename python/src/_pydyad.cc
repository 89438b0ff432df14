// _pydyad.cc: the pybind11 extension behind the pydyad package.
//
// This module is a thin, typed layer over DYAD's public API: the C API
// (dyad_ctx.h and dyad_client.h) and, for interruption, the C++ client
// (dyad_client.hpp); it includes no internal header. The Python-facing API that upstream scripts
// use (the Dyad class, dyad_open, DyadFile, the enums) lives in the pure-Python package; this file
// only does what Python cannot do well by itself:
//
//  * turns every failing dyad_rc_t into a DyadError (a RuntimeError) that
//    carries the numeric code (.rc), its symbolic name (.name), and the
//    calling thread's dyad_last_error() text, read right after the call and
//    before anything else can overwrite it;
//  * releases the GIL around every call that may block (produce, consume,
//    get_metadata, init/finalize, which may close connections), so other
//    Python threads keep running while a consumer waits for publication;
//  * makes those waits interruptible by Ctrl-C: the client library polls a
//    process-wide interrupt check (dyad::client::SetInterruptCheck) at least
//    every 200 ms; ours briefly takes the GIL and runs Python's pending signal
//    handlers, so a KeyboardInterrupt raised by the SIGINT handler cancels
//    the wait and then propagates as the KeyboardInterrupt itself;
//  * owns dyad_metadata_t records (class Metadata), freeing them exactly once.
//
// The C context is one per process and fork-safe (a forked DataLoader worker
// opens its own connection to the service), so nothing here is per-object.

#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <dyad/client/dyad_client.h>
#include <dyad/client/dyad_producer.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/core/dyad_ctx.h>
#include <dyad/client/dyad_client.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace {

// The DyadError type object, created at import; never freed (module lifetime).
PyObject* g_dyad_error = nullptr;

// True while this thread runs a DYAD call for Python with the GIL released.
// The interrupt check consults Python only for such threads: other threads
// of the process (C++ code using the C API directly) have no Python state to
// consult, and taking the GIL from them during interpreter shutdown could
// block forever.
thread_local bool t_in_python_call = false;

// Set once this thread's check saw a pending Python exception (normally
// KeyboardInterrupt), so later polls of the same call answer at once.
thread_local bool t_interrupted = false;

bool PythonInterruptCheck() {
  if (!t_in_python_call) return false;
  if (t_interrupted) return true;
  if (!Py_IsInitialized()) return false;
  py::gil_scoped_acquire gil;
  // PyErr_CheckSignals runs the handlers only on the main thread; a
  // handler that raises (SIGINT -> KeyboardInterrupt) leaves the exception
  // set on this thread, where the binding finds it after the call returns.
  if (PyErr_CheckSignals() != 0) t_interrupted = true;
  return t_interrupted;
}

// Runs `fn` (a C API call) without the GIL and with interrupts enabled.
// Afterwards, if a signal handler raised, that exception wins over the
// call's own (CANCELLED) result, as Ctrl-C should.
template <typename Fn>
dyad_rc_t CallBlocking(Fn&& fn) {
  dyad_rc_t rc;
  {
    py::gil_scoped_release nogil;
    t_in_python_call = true;
    t_interrupted = false;
    rc = fn();
    t_in_python_call = false;
  }
  if (t_interrupted || PyErr_Occurred() != nullptr) {
    t_interrupted = false;
    if (PyErr_Occurred() != nullptr) throw py::error_already_set();
  }
  return rc;
}

// Raises DyadError for `rc`. The message is "<NAME>: <dyad_last_error()>",
// falling back to the code's generic description when the library left no
// message.
[[noreturn]] void Raise(dyad_rc_t rc, const char* op) {
  const char* last = dyad_last_error();
  std::string text = dyad_rc_name(rc);
  text += ": ";
  if (last != nullptr && *last != '\0') {
    text += last;
  } else {
    text += op;
    text += ": ";
    text += dyad_rc_message(rc);
  }
  py::object type = py::reinterpret_borrow<py::object>(g_dyad_error);
  py::object exc = type(text);
  exc.attr("rc") = py::int_(static_cast<int>(rc));
  exc.attr("name") = py::str(dyad_rc_name(rc));
  PyErr_SetObject(g_dyad_error, exc.ptr());
  throw py::error_already_set();
}

void Check(dyad_rc_t rc, const char* op) {
  if (DYAD_IS_ERROR(rc)) Raise(rc, op);
}

// Converts an optional Python string into a C string that outlives the call.
const char* OptCStr(const std::optional<std::string>& s) { return s ? s->c_str() : nullptr; }

// An owned dyad_metadata_t: the "raw" metadata of get_metadata(raw=True).
// Also constructible from fields, since upstream lets callers build records
// by hand for consume_w_metadata.
class Metadata {
 public:
  explicit Metadata(dyad_metadata_t* m) : m_(m) {}
  Metadata(const std::string& fpath, uint32_t owner_rank, uint64_t size, uint64_t version) {
    m_ = static_cast<dyad_metadata_t*>(std::calloc(1, sizeof(dyad_metadata_t)));
    if (m_ == nullptr) throw std::bad_alloc();
    m_->fpath = ::strdup(fpath.c_str());
    if (m_->fpath == nullptr) {
      std::free(m_);
      throw std::bad_alloc();
    }
    m_->owner_rank = owner_rank;
    m_->size = size;
    m_->version = version;
  }
  ~Metadata() { Free(); }
  Metadata(const Metadata&) = delete;
  Metadata& operator=(const Metadata&) = delete;

  // Frees the C record now (dyad_free_metadata); idempotent.
  void Free() { dyad_free_metadata(&m_); }
  bool valid() const { return m_ != nullptr; }
  const dyad_metadata_t* get() const { return m_; }

  const dyad_metadata_t& Require() const {
    if (m_ == nullptr) throw py::value_error("metadata was already freed");
    return *m_;
  }

 private:
  dyad_metadata_t* m_ = nullptr;
};

// What upstream's ctypes pointer gives as `.contents`: the record's fields,
// fpath as bytes (a c_char_p field). A snapshot taken at access time; the
// record does not change once returned.
struct MetadataContents {
  py::bytes fpath;
  uint32_t owner_rank = 0;
  uint64_t size = 0;
  uint64_t version = 0;
};

std::string ToFsPath(const py::handle& path) {
  // Accepts str, bytes and os.PathLike, like open(); fsencode keeps names
  // that are not valid UTF-8 byte-exact (surrogateescape).
  py::bytes fs = py::module_::import("os").attr("fsencode")(path);
  return std::string(fs);
}

// A file name from C as Python's os.fsdecode gives it (surrogateescape for
// bytes that are not UTF-8), the inverse of ToFsPath.
py::object FsDecode(const char* s) {
  return py::module_::import("os").attr("fsdecode")(py::bytes(s));
}

}  // namespace

// A batch consume running in the background (consume_start): the names,
// one result per name, and the thread doing it. wait() joins it without
// the GIL; a handle dropped unwaited is joined by its destructor.
class AsyncConsume {
 public:
  // `timeout_ms` < 0: the configured DYAD_CONSUME_TIMEOUT.
  AsyncConsume(dyad::client::Client client, std::vector<std::string> names, int64_t timeout_ms)
      : names_(std::move(names)), results_(names_.size()) {
    thread_ = std::thread([this, client, timeout_ms] {
      dyad::client::Client c = client;
      request_ = c.ConsumeBatch(names_, timeout_ms, &results_);
    });
  }
  ~AsyncConsume() { Join(); }
  AsyncConsume(const AsyncConsume&) = delete;
  AsyncConsume& operator=(const AsyncConsume&) = delete;

  void Join() {
    if (!thread_.joinable()) return;
    py::gil_scoped_release nogil;
    thread_.join();
  }
  // (rc, message) per name, in order.
  std::vector<std::pair<int, std::string>> Results() {
    Join();
    std::vector<std::pair<int, std::string>> out;
    for (const dyad::client::Status& st : results_) {
      const dyad::client::Status& eff = request_.ok() ? st : request_;
      const bool ok = eff.ok() || eff.code() == DYAD_RC_UNTRACKED;
      out.emplace_back(ok ? DYAD_RC_OK : eff.code(), ok ? std::string() : eff.message());
    }
    return out;
  }
  size_t size() const { return names_.size(); }

 private:
  std::vector<std::string> names_;
  std::vector<dyad::client::Status> results_;
  dyad::client::Status request_;
  std::thread thread_;
};

PYBIND11_MODULE(_pydyad, m) {
  m.doc() = "Low-level bindings of the DYAD C API; use the pydyad package instead.";

  // Class-level defaults: an instance re-created from its message alone
  // (e.g. DataLoader re-raising a worker's exception) still has both fields.
  py::dict defaults;
  defaults["rc"] = py::none();
  defaults["name"] = py::none();
  g_dyad_error = PyErr_NewExceptionWithDoc(
      "pydyad.DyadError",
      "A DYAD call failed. .rc is the dyad_rc_t code (int), .name its symbolic "
      "name (e.g. 'DYAD_RC_TIMEOUT'); str() gives the name and the library's message.",
      PyExc_RuntimeError, defaults.ptr());
  if (g_dyad_error == nullptr) throw py::error_already_set();
  m.attr("DyadError") = py::reinterpret_borrow<py::object>(g_dyad_error);

  dyad::client::SetInterruptCheck(&PythonInterruptCheck);

  m.def(
      "rc_name", [](int rc) { return std::string(dyad_rc_name(rc)); },
      "Symbolic name of a dyad_rc_t code.");
  m.def(
      "rc_message", [](int rc) { return std::string(dyad_rc_message(rc)); },
      "One-line description of a dyad_rc_t code.");
  m.def(
      "last_error", [] { return std::string(dyad_last_error()); },
      "Message of this thread's last failed DYAD call.");

  m.def(
      "init",
      [](bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
         bool fsync_write, unsigned key_depth, unsigned key_bins, unsigned service_mux,
         std::optional<std::string> kvs_namespace, std::optional<std::string> prod_path,
         std::optional<std::string> cons_path, bool relative, std::optional<std::string> dtl_mode,
         int comm_mode, uintptr_t flux_handle) {
        dyad_rc_t rc = CallBlocking([&] {
          return dyad_init(debug, check, shared_storage, reinit, async_publish, fsync_write,
                           key_depth, key_bins, service_mux, OptCStr(kvs_namespace),
                           OptCStr(prod_path), OptCStr(cons_path), relative, OptCStr(dtl_mode),
                           static_cast<dyad_dtl_comm_mode_t>(comm_mode),
                           reinterpret_cast<void*>(flux_handle));
        });
        Check(rc, "dyad_init");
      },
      py::arg("debug"), py::arg("check"), py::arg("shared_storage"), py::arg("reinit"),
      py::arg("async_publish"), py::arg("fsync_write"), py::arg("key_depth"), py::arg("key_bins"),
      py::arg("service_mux"), py::arg("kvs_namespace"), py::arg("prod_managed_path"),
      py::arg("cons_managed_path"), py::arg("relative_to_managed_path"), py::arg("dtl_mode"),
      py::arg("dtl_comm_mode"), py::arg("flux_handle") = 0,
      "dyad_init() with explicit settings; flux_handle is the address of the caller's "
      "flux_t (0: none).");

  m.def(
      "init_env",
      [](int comm_mode, uintptr_t flux_handle) {
        dyad_rc_t rc = CallBlocking([&] {
          return dyad_init_env(static_cast<dyad_dtl_comm_mode_t>(comm_mode),
                               reinterpret_cast<void*>(flux_handle));
        });
        Check(rc, "dyad_init_env");
      },
      py::arg("dtl_comm_mode"), py::arg("flux_handle") = 0,
      "dyad_init_env(): settings from the DYAD_* variables; flux_handle as for init.");

  m.def(
      "is_initialized", [] { return dyad_ctx_get() != nullptr; },
      "Whether this process's DYAD context is initialized.");

  m.def(
      "managed_paths",
      [] {
        py::object prod = py::none(), cons = py::none();
        dyad::client::Client client;
        if (dyad::client::Client::FromContext(dyad_ctx_get(), &client).ok()) {
          const dyad::client::Options o = client.options();
          if (!o.producer_path.empty()) prod = FsDecode(o.producer_path.c_str());
          if (!o.consumer_path.empty()) cons = FsDecode(o.consumer_path.c_str());
        }
        return py::make_tuple(prod, cons);
      },
      "(producer, consumer) managed directories of the context, absolute; None for one "
      "not set or when not initialized.");

  m.def(
      "finalize", [] { Check(CallBlocking([] { return dyad_finalize(); }), "dyad_finalize"); },
      "dyad_finalize(): release this process's context (safe twice).");

  m.def(
      "produce",
      [](py::handle fname) {
        std::string path = ToFsPath(fname);
        dyad_rc_t rc = CallBlocking([&] { return dyad_produce(dyad_ctx_get(), path.c_str()); });
        Check(rc, "produce");
      },
      py::arg("fname"), "dyad_produce(): publish a complete, closed file.");

  m.def(
      "producer_lock",
      [](int fd) {
        Check(CallBlocking([&] { return dyad_producer_lock(dyad_ctx_get(), fd); }),
              "producer_lock");
      },
      py::arg("fd"),
      "dyad_producer_lock(): the producer's exclusive lock on an open file, bounded by the "
      "RPC timeout; released when the file is closed.");

  m.def(
      "consume",
      [](py::handle fname) {
        std::string path = ToFsPath(fname);
        dyad_rc_t rc = CallBlocking([&] { return dyad_consume(dyad_ctx_get(), path.c_str()); });
        Check(rc, "consume");
      },
      py::arg("fname"), "dyad_consume(): wait until the file is complete locally.");

  m.def(
      "prefetch",
      [](py::handle pattern, bool cancel) {
        std::string p = ToFsPath(pattern);
        dyad_rc_t rc = CallBlocking([&] {
          return cancel ? dyad_prefetch_cancel(dyad_ctx_get(), p.c_str())
                        : dyad_prefetch(dyad_ctx_get(), p.c_str());
        });
        Check(rc, "prefetch");
      },
      py::arg("pattern"), py::arg("cancel") = false,
      "dyad_prefetch(): the node's service fetches files matching `pattern` (prefix or glob "
      "under the consumer directory) as they are published; cancel=True withdraws it.");

  py::class_<AsyncConsume>(m, "AsyncConsume", "A batch consume started by consume_start().")
      .def("results", &AsyncConsume::Results,
           "Waits for the batch; (rc, message) per name, in order (rc 0: complete locally).")
      .def("__len__", &AsyncConsume::size);

  m.def(
      "consume_start",
      [](py::iterable fnames, std::optional<double> timeout) {
        std::vector<std::string> names;
        for (py::handle f : fnames) names.push_back(ToFsPath(f));
        dyad::client::Client c;
        dyad::client::Status st = dyad::client::Client::FromContext(dyad_ctx_get(), &c);
        if (!st.ok()) Raise(dyad::client::SetLastError(st), "consume_start");
        int64_t ms = -1;
        if (timeout) ms = *timeout <= 0 ? 0 : static_cast<int64_t>(*timeout * 1000.0);
        return std::make_unique<AsyncConsume>(c, std::move(names), ms);
      },
      py::arg("fnames"), py::arg("timeout") = py::none(),
      "Starts consuming many files in one request, in the background; `timeout` (seconds) "
      "replaces DYAD_CONSUME_TIMEOUT for them (0: only files already published).");

  py::class_<MetadataContents>(m, "MetadataContents",
                               "Fields of a Metadata record (Metadata.contents).")
      .def_readonly("fpath", &MetadataContents::fpath)
      .def_readonly("owner_rank", &MetadataContents::owner_rank)
      .def_readonly("size", &MetadataContents::size)
      .def_readonly("version", &MetadataContents::version)
      .def("__repr__", [](const MetadataContents& c) -> std::string {
        return py::str("<pydyad MetadataContents fpath={!r} owner_rank={}>")
            .format(c.fpath, c.owner_rank)
            .cast<std::string>();
      });

  py::class_<Metadata>(m, "Metadata", "An owned dyad_metadata_t record (get_metadata(raw=True)).")
      .def(py::init<const std::string&, uint32_t, uint64_t, uint64_t>(), py::arg("fpath"),
           py::arg("owner_rank"), py::arg("size") = 0, py::arg("version") = 0)
      .def_property_readonly("fpath",
                             [](const Metadata& md) { return FsDecode(md.Require().fpath); })
      .def_property_readonly("owner_rank",
                             [](const Metadata& md) { return md.Require().owner_rank; })
      .def_property_readonly("size", [](const Metadata& md) { return md.Require().size; })
      .def_property_readonly("version", [](const Metadata& md) { return md.Require().version; })
      .def_property_readonly(
          "contents",
          [](const Metadata& md) {
            const dyad_metadata_t& r = md.Require();
            return MetadataContents{py::bytes(r.fpath), r.owner_rank, r.size, r.version};
          },
          "The record's fields, as upstream's ctypes pointer .contents "
          "(fpath as bytes).")
      .def_property_readonly("valid", &Metadata::valid)
      .def("free", &Metadata::Free, "Free the C record now (idempotent).")
      .def("__repr__", [](const Metadata& md) -> std::string {
        if (!md.valid()) return "<pydyad Metadata (freed)>";
        const dyad_metadata_t& r = *md.get();
        return py::str("<pydyad Metadata fpath={!r} owner_rank={} size={} version={}>")
            .format(FsDecode(r.fpath), r.owner_rank, r.size, r.version)
            .cast<std::string>();
      });

  m.def(
      "get_metadata",
      [](py::handle fname, bool should_wait) -> py::object {
        std::string path = ToFsPath(fname);
        dyad_metadata_t* raw = nullptr;
        dyad_rc_t rc = CallBlocking(
            [&] { return dyad_get_metadata(dyad_ctx_get(), path.c_str(), should_wait, &raw); });
        if (rc == DYAD_RC_NOTFOUND && !should_wait) {
          dyad_free_metadata(&raw);
          return py::none();
        }
        if (DYAD_IS_ERROR(rc)) {
          // Raise reads dyad_last_error() first; any partial record is
          // freed afterwards, while the exception unwinds.
          struct Freer {
            dyad_metadata_t** p;
            ~Freer() { dyad_free_metadata(p); }
          } freer{&raw};
          Raise(rc, "get_metadata");
        }
        // OK with no record: the name is outside the consumer directory.
        if (raw == nullptr) return py::none();
        return py::cast(new Metadata(raw), py::return_value_policy::take_ownership);
      },
      py::arg("fname"), py::arg("should_wait") = false,
      "dyad_get_metadata(): a Metadata, or None when not published (and not waiting) "
      "or outside the consumer directory.");

  m.def(
      "consume_w_metadata",
      [](py::handle fname, const Metadata* md) {
        std::string path = ToFsPath(fname);
        if (md != nullptr && !md->valid()) throw py::value_error("metadata was already freed");
        const dyad_metadata_t* raw = md != nullptr ? md->get() : nullptr;
        dyad_rc_t rc = CallBlocking(
            [&] { return dyad_consume_w_metadata(dyad_ctx_get(), path.c_str(), raw); });
        Check(rc, "consume_w_metadata");
      },
      py::arg("fname"), py::arg("metadata").none(true),
      "dyad_consume_w_metadata(): consume with a record from get_metadata.");
}
