/* LD_PRELOAD helper for diagnosing native crashes on the GPU machine: prints the native
 * backtrace of a SIGSEGV / SIGABRT to stderr, then re-raises. Build:
 *   gcc -shared -fPIC -o /tmp/segv.so scripts/debug/segv_backtrace.c */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_signal(int sig) {
  void* frames[64];
  int n = backtrace(frames, 64);
  const char header[] = "\n*** native backtrace ***\n";
  write(2, header, sizeof(header) - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  signal(SIGSEGV, on_signal);
  signal(SIGBUS, on_signal);
}
