// demo.h: dyad-demo (what `dyad demo` runs), a two-node DYAD run on one
// machine.
//
// RunDemo starts an emulated cluster (tools/emu: one network namespace, node
// directory and dyad-service per node when run as root, loopback otherwise),
// starts a consumer on node B that blocks until files appear, then a producer
// on node A, verifies every file and prints a summary. It always tears the
// cluster down, also on SIGINT/SIGTERM.
//
// The same entry point hosts the hidden worker roles the demo, the
// integration tests and the benchmarks run inside emulated nodes
// (`dyad-demo --role produce|consume ...`); they use only the public C API.
//
// `argv[0]` is the program; options follow.
// Call from the main thread before starting other threads (signal handling).
#pragma once

namespace dyad {

// Returns the process exit code (0 on success).
int RunDemo(int argc, char** argv);

}  // namespace dyad
