#include "app/stop.h"

#include <unistd.h>

#include <csignal>

namespace gossamer::app {

namespace {

std::atomic<bool> g_stop{false};

void say(const char* text, std::size_t size) { (void)!::write(STDERR_FILENO, text, size); }

extern "C" void on_graceful_stop(int) {
  if (g_stop.exchange(true)) {
    static const char kMsg[] = "\ngossamer: interrupted again: leaving at once, without a checkpoint\n";
    say(kMsg, sizeof(kMsg) - 1);
    ::_exit(130);
  }
}

extern "C" void on_immediate_stop(int) {
  static const char kMsg[] = "\ngossamer: interrupted\n";
  say(kMsg, sizeof(kMsg) - 1);
  ::_exit(130);
}

}  // namespace

const std::atomic<bool>& install_graceful_stop() {
  std::signal(SIGINT, on_graceful_stop);
  std::signal(SIGTERM, on_graceful_stop);
  return g_stop;
}

bool stop_requested() { return g_stop.load(); }

void install_immediate_stop() {
  std::signal(SIGINT, on_immediate_stop);
  std::signal(SIGTERM, on_immediate_stop);
}

}  // namespace gossamer::app
