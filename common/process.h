// Process-level helpers of sluice's servers.
#ifndef SLUICE_COMMON_PROCESS_H_
#define SLUICE_COMMON_PROCESS_H_

#include <string>

namespace sluice {

// Blocks SIGINT and SIGTERM in this thread and every thread it starts later; call first thing
// in main, then WaitForShutdownSignal() once the servers run.
void BlockShutdownSignals();
// Waits for SIGINT or SIGTERM; returns the signal.
int WaitForShutdownSignal();

// The name a model is served under: its file name without directory and ".gguf".
std::string ServedModelName(const std::string& path);

}  // namespace sluice

#endif  // SLUICE_COMMON_PROCESS_H_
