// LD_PRELOAD helper of the GPU focus stage (.ci/gpu/run.sh), for images without gdb: on a fatal
// signal it writes the native stack to stderr, then dies of that signal as the process would have.
// Frames of functions an object does not export print as "object(+0xoffset)"; run.sh turns those
// into function names with addr2line. Python's faulthandler (-X faulthandler) installs its handler
// after this one, dumps the Python stack first, then re-raises the signal into this handler.
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static const int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

static void on_fatal_signal(int sig) {
  static const char head[] = "\n== native backtrace (crash_backtrace.so) ==\n";
  void* frames[128];
  (void)!write(STDERR_FILENO, head, sizeof head - 1);
  backtrace_symbols_fd(frames, backtrace(frames, 128), STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  // The first backtrace() call loads libgcc_s; do it here, not inside the signal handler.
  void* warm[1];
  backtrace(warm, 1);
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_fatal_signal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < sizeof kSignals / sizeof kSignals[0]; ++i) sigaction(kSignals[i], &action, NULL);
}
