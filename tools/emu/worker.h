// worker.h: the files a worker process exchanges with whoever started it.
//
// The producer and consumer workers (hidden roles of `dyad demo`, run inside
// emulated nodes) read a manifest (which files, how big) and append one
// result line per file as they go, so a worker that is killed still leaves
// what it finished. Both are text files, one record per line, tab-separated,
// with names percent-escaped so spaces, tabs and non-ASCII bytes survive.
// Also small statistics helpers for reports. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/format.h"
#include "common/status.h"

namespace dyad::emu {

struct ManifestEntry {
  std::string name;   // path relative to the managed directory
  int64_t size = -1;  // bytes; negative: unknown (workers do not check it)
};

Status WriteManifest(const std::string& path, const std::vector<ManifestEntry>& entries);
Result<std::vector<ManifestEntry>> ReadManifest(const std::string& path);

struct FileResult {
  std::string name;
  int rc = 0;             // dyad_rc_t of the produce/consume call
  uint64_t size = 0;      // bytes written (producer) or found (consumer)
  uint64_t start_ns = 0;  // wall clock: producer before writing, consumer before consume
  uint64_t end_ns = 0;    // wall clock when the produce/consume call returned
  uint64_t call_ns = 0;   // duration of the produce/consume call itself
  uint64_t io_ns = 0;     // producer: writing the file; consumer: reading it back
  uint64_t version = 0;   // published version (producer's mtime, ns), 0 if unknown
  int verified = -1;      // consumer: 1 content matches, 0 it does not, -1 not checked
  std::string message;    // error text (dyad_last_error) or ""
};

std::string FormatResult(const FileResult& r);  // one line, with '\n'
Result<std::vector<FileResult>> ReadResults(const std::string& path);

// Percent-escapes '%', tab, CR and LF (everything else is kept as is).
std::string EscapeField(const std::string& s);
std::string UnescapeField(const std::string& s);

// What a worker's loop cost its own process (every thread, getrusage). A
// worker prints it as one "loop_usage <cpu us> <voluntary> <involuntary>"
// line on its output; the benchmarks read it back for their per-call
// breakdowns.
struct LoopUsage {
  int64_t cpu_us = 0;       // user + system
  int64_t voluntary = 0;    // context switches where a thread blocked
  int64_t involuntary = 0;  // ... where it was preempted
};
LoopUsage UsageNow();
// `now` minus `start`, as a "loop_usage" line with '\n'.
std::string FormatLoopUsage(const LoopUsage& start, const LoopUsage& now);
// The last "loop_usage" line of `text`; false when there is none.
bool FindLoopUsage(const std::string& text, LoopUsage* out);

// p in [0, 100]; nearest-rank on a copy. 0 for an empty input.
double Percentile(std::vector<double> values, double p);
double Median(std::vector<double> values);

// "1.5 KiB", "256.0 MiB" (common/format.h).
using ::dyad::HumanBytes;

}  // namespace dyad::emu
