#include "ccl/tests/verbs/ranks.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <sstream>
#include <thread>

namespace softrdma::ccl::test {

RootProcess::RootProcess() {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    close(fds[0]);
    std::string text;
    try {
      text = make_unique_id().to_string();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "make_unique_id: %s\n", e.what());
    }
    text += '\n';
    if (write(fds[1], text.data(), text.size()) < 0) _exit(1);
    close(fds[1]);
    for (;;) pause();  // the root thread serves until the parent kills this process
  }
  close(fds[1]);
  std::string text;
  char c;
  while (read(fds[0], &c, 1) == 1 && c != '\n') text += c;
  close(fds[0]);
  if (text.empty()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    throw std::runtime_error("the root helper process failed");
  }
  id_ = UniqueId::from_string(text);
}

RootProcess::~RootProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::vector<RankResult> run_ranks(int n, const std::function<void(int rank)>& fn,
                                  std::chrono::seconds deadline, const EnvList& env) {
  std::vector<pid_t> pids(n, -1);
  std::vector<std::string> logs(n);
  std::fflush(stdout);
  std::fflush(stderr);
  for (int r = 0; r < n; ++r) {
    char tmpl[] = "/tmp/ccl-rank-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    logs[r] = tmpl;
    pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
      setvbuf(stdout, nullptr, _IOLBF, 0);
      for (const auto& [k, v] : env) {
        if (v.empty())
          unsetenv(k.c_str());
        else
          setenv(k.c_str(), v.c_str(), 1);
      }
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);  // no gtest teardown, no static destructors in the child
    }
    close(fd);
    pids[r] = pid;
  }

  std::vector<RankResult> res(n);
  const auto until = std::chrono::steady_clock::now() + deadline;
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      if (pids[r] < 0) continue;
      int st = 0;
      pid_t w = waitpid(pids[r], &st, WNOHANG);
      if (w == pids[r]) {
        res[r].exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        pids[r] = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() >= until) {
      for (int r = 0; r < n; ++r)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          res[r].timed_out = true;
          pids[r] = -1;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < n; ++r) {
    std::ifstream in(logs[r]);
    std::stringstream ss;
    ss << in.rdbuf();
    res[r].output = ss.str();
    unlink(logs[r].c_str());
  }
  return res;
}

int free_tcp_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string describe(const std::vector<RankResult>& results) {
  std::string s;
  for (size_t r = 0; r < results.size(); ++r) {
    s += "--- rank " + std::to_string(r) + ": " +
         (results[r].timed_out ? std::string("killed at the deadline")
                               : "exit " + std::to_string(results[r].exit_code)) +
         "\n" + results[r].output;
  }
  return s;
}

}  // namespace softrdma::ccl::test
