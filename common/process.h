// Process-level helpers of sluice's servers.
#ifndef SLUICE_COMMON_PROCESS_H_
#define SLUICE_COMMON_PROCESS_H_

#include <functional>
#include <string>

#include "absl/status/status.h"

namespace sluice {

// Blocks SIGINT and SIGTERM in this thread and every thread it starts later; call first thing
// in main, then WaitForShutdownSignal() once the servers run.
void BlockShutdownSignals();
// Waits for SIGINT or SIGTERM; returns the signal.
int WaitForShutdownSignal();
// WaitForShutdownSignal, then says "<name>: signal N, stopping" on stderr.
void AwaitShutdown(const std::string& name);

// main() of a sluice server: blocks the shutdown signals, parses flags, runs `run` and turns
// its status into the exit code, printing "<program>: <error>" on failure.
int ServerMain(int argc, char** argv, const char* program,
               const std::function<absl::Status()>& run);

// The name a model is served under: its file name without directory and ".gguf".
std::string ServedModelName(const std::string& path);

}  // namespace sluice

#endif  // SLUICE_COMMON_PROCESS_H_
