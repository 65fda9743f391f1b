// Forked roles of the multi-process kv tests (process_test.cpp, devices_test.cpp): a child
// running a function (optionally with its own SOFTRDMA_ADDR), and a one-byte pipe signal.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

namespace softrdma::kv::test {

/// A forked child running `fn` (with SOFTRDMA_ADDR = `addrs` when not empty); its exit code
/// is 0 when fn returned, 1 when it threw (the message goes to stderr, which the test shows).
struct Child {
  pid_t pid = -1;
  explicit Child(const std::function<void()>& fn) : Child(std::string(), fn) {}
  Child(const std::string& addrs, const std::function<void()>& fn) {
    std::fflush(stdout);
    std::fflush(stderr);
    pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        if (!addrs.empty()) setenv("SOFTRDMA_ADDR", addrs.c_str(), 1);
        fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "child %d%s: %s\n", getpid(),
                     addrs.empty() ? "" : (" (" + addrs + ")").c_str(), e.what());
        code = 1;
      }
      std::fflush(stderr);
      _exit(code);
    }
  }
  /// Exit code, or -1 if it had to be killed at the deadline (or died by a signal).
  int wait_for(std::chrono::seconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = -1;
    return -1;
  }
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

/// A pipe carrying one-byte signals between processes.
struct Signal {
  int fd[2];
  Signal() {
    if (pipe(fd) != 0) throw std::runtime_error("pipe");
  }
  ~Signal() {
    close(fd[0]);
    close(fd[1]);
  }
  void raise() { [[maybe_unused]] ssize_t n = write(fd[1], "x", 1); }
  bool wait(std::chrono::milliseconds timeout) {
    pollfd p{fd[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char c;
    return read(fd[0], &c, 1) == 1;
  }
};

}  // namespace softrdma::kv::test
