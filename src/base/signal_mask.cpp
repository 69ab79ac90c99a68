// AsyncSignalsBlocked (see signal_mask.h).
#include "tessera/base/signal_mask.h"

#include <pthread.h>

#include <initializer_list>

namespace tessera {
namespace {

sigset_t async_signals() {
  sigset_t set;
  sigfillset(&set);
  for (int synchronous : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&set, synchronous);
  return set;
}

}  // namespace

AsyncSignalsBlocked::AsyncSignalsBlocked() {
  static const sigset_t blocked = async_signals();
  pthread_sigmask(SIG_BLOCK, &blocked, &old_);
}

AsyncSignalsBlocked::~AsyncSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

}  // namespace tessera
