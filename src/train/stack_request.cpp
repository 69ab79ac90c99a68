#include "train/stack_request.h"

#include <unistd.h>

#include <chrono>
#include <csignal>

namespace tessera::train {

StackRequestWatcher::StackRequestWatcher(std::string request) : request_(std::move(request)) {
  if (!request_.empty()) thread_ = std::thread([this] { loop(); });
}

StackRequestWatcher::~StackRequestWatcher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StackRequestWatcher::loop() {
  std::unique_lock lock(mutex_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(kPollMs), [this] { return stopping_; })) {
    // unlink() both tests and consumes the request: one dump per request.
    if (::unlink(request_.c_str()) == 0) {
      ++answered_;
      ::kill(::getpid(), SIGUSR1);
    }
  }
}

}  // namespace tessera::train
