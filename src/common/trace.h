// trace.h: a Chrome/Perfetto trace of DYAD operations (DYAD_TRACE).
//
// With DYAD_TRACE=<file> set, every DYAD process (clients, through any front
// end, and services) appends one "complete" event (ph "X", ts and dur in
// microseconds of the wall clock, pid, tid) per publish, locate, consume,
// fetch and serve span to <file>, in the Trace Event Format's JSON array
// form that chrome://tracing and ui.perfetto.dev open directly. Several
// processes may share one file: the first creates it with the opening "["
// (atomically, so no writer ever precedes it), then each event is one
// append of one line, which keeps lines whole. The array is never closed,
// which both viewers accept; "%p" (pid) and "%h" (host name) in the name
// give one file per process instead. Each process names itself once (a
// "process_name" metadata event): "dyad-service rank 1 (node3) [node3 pid
// 42]", "dyad client: <program> [host pid N]". The events' "pid" is
// TraceProcessId(host, pid), so one file shared across nodes keeps equal
// pids of different nodes apart.
//
// The file is opened without following a symlink and refused (tracing off,
// one message) when it belongs to another user, group or others may write
// it, or it is not a regular file; a new one is created 0600 under a
// private random name and linked into place (never O_CREAT on the path).
//
// Unset, a span costs one relaxed atomic load. Fork-safe and lock-free: no
// lock is ever taken, the file is opened once per process (a child that
// inherits it names itself again), and a failure to open or write switches
// tracing off with one message on stderr.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/status.h"

namespace dyad {

bool TraceEnabled();
// The "pid" of a process's events: one of 1023 buckets of `host`'s
// FNV-1a hash, times 2^22, plus `pid` (< 2^22 on Linux). 32 bits.
uint32_t TraceProcessId(const std::string& host, pid_t pid);
// The name this process shows in the trace (default "dyad client: <comm>").
void TraceSetProcessName(const std::string& name);

// One span: started at construction, written at destruction.
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category);
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

  TraceSpan& Arg(const char* key, const std::string& value);
  TraceSpan& Arg(const char* key, uint64_t value);
  // Records the outcome ("rc": "DYAD_RC_OK" or the error code's name).
  TraceSpan& Rc(const dyad::Status& st);

 private:
  bool on_ = false;
  const char* name_;
  const char* category_;
  uint64_t start_us_ = 0;
  std::string args_;  // `"key":value` pairs, comma-separated
};

// JSON string literal of `s` (quotes included); control characters and
// invalid UTF-8 bytes are escaped, so a path never breaks the file.
std::string JsonQuote(const std::string& s);

}  // namespace dyad
