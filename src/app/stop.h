// Ctrl-C and SIGTERM for the commands, in one place. A command that can stop gracefully (train,
// peer) installs the graceful handlers: the first signal sets the flag it polls (it then checkpoints
// and exits 130), a second one ends the process at once (130, one line saying so). The other
// commands install the immediate handlers: they exit 130 at once, since they write their results
// whole at the end. The handlers only touch an atomic flag and call write(2) and _exit(2).
#pragma once

#include <atomic>

namespace gossamer::app {

// Installs the graceful handlers; the flag becomes true at the first signal.
const std::atomic<bool>& install_graceful_stop();
// Whether a stop was asked for (graceful handlers).
bool stop_requested();
// Installs the immediate handlers.
void install_immediate_stop();

}  // namespace gossamer::app
