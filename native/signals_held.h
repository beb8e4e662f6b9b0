#pragma once
// Holds this thread's signals while the kernel verifies programs.
//
// The verifier gives up with EAGAIN when a signal is pending for the loading
// thread, and libbpf retries a load only a few times. A process that gets
// signals at a steady rate (a CPU profiler's SIGPROF, a parent's SIGCHLD
// storm, terminal resizes) then cannot load at all; on 5.10 and 6.1 the
// verification of the kprobe backend takes long enough for that to happen
// by chance. Blocked signals are not lost: they are delivered to this thread,
// or to another, once the mask is restored.
#include <signal.h>
#include <pthread.h>

class SignalsHeld {
 public:
  SignalsHeld() {
    sigset_t all;
    sigfillset(&all);
    held_ = pthread_sigmask(SIG_BLOCK, &all, &saved_) == 0;
  }
  ~SignalsHeld() {
    if (held_) pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  SignalsHeld(const SignalsHeld&) = delete;
  SignalsHeld& operator=(const SignalsHeld&) = delete;

 private:
  sigset_t saved_;
  bool held_ = false;
};
