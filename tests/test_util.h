// Helpers shared by the test suites.
#ifndef PSTRAIN_TESTS_TEST_UTIL_H_
#define PSTRAIN_TESTS_TEST_UTIL_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

#define ASSERT_OK(expr)                          \
  do {                                           \
    const ::pstrain::Status pstrain_s_ = (expr); \
    ASSERT_TRUE(pstrain_s_.ok()) << pstrain_s_;  \
  } while (0)
#define EXPECT_OK(expr)                          \
  do {                                           \
    const ::pstrain::Status pstrain_s_ = (expr); \
    EXPECT_TRUE(pstrain_s_.ok()) << pstrain_s_;  \
  } while (0)

namespace pstrain::testing {

// ../shared/data beside the checkout (PSTRAIN_SHARED_DATA_DIR overrides it at run time).
inline std::string SharedDataDir() {
  const char* env = std::getenv("PSTRAIN_SHARED_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : PSTRAIN_SHARED_DATA_DIR;
}
// The built `pstrain` binary ($PSTRAIN_BINARY where the tests run from a
// bundle, scripts/bundle.sh, on another host).
inline std::string PstrainBinary() {
  const char* env = std::getenv("PSTRAIN_BINARY");
  return env != nullptr && *env != '\0' ? env : PSTRAIN_BINARY;
}
inline std::string SourceDir() { return PSTRAIN_SOURCE_DIR; }
// A new empty folder under $TMPDIR (or /tmp) named after `what`; "" if none
// could be made. The caller removes it.
inline std::string MakeTempDir(const std::string& what) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/pstrain-" + what + "-XXXXXX";
  return mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

// The whole file at `path` ("" if it cannot be read).
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A fresh folder from MakeTempDir(what), removed with its contents at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& what = "test") : path_(MakeTempDir(what)) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs `cmd` with /bin/sh; *output gets what it writes to stdout (add
// " 2>&1" for stderr too). Returns its exit code, -1 if it did not exit.
inline int RunShell(const std::string& cmd, std::string* output) {
  output->clear();
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A port that binds now on 127.0.0.1, from 20000..32767: below the kernel's
// ephemeral range (32768..), so a concurrent test's outgoing connection cannot
// take it before the process under test binds it (a port from bind(0) could).
inline int FreePort() {
  static std::mt19937 rng(static_cast<unsigned>(getpid()) ^ static_cast<unsigned>(time(nullptr)));
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = 20000 + static_cast<int>(rng() % 12768);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (ok) return port;
  }
  ADD_FAILURE() << "no free port in 20000..32767";
  return 0;
}

// Why this machine cannot listen on the IPv6 loopback address ::1 (IPv6
// turned off in the kernel or the network namespace); empty when it can.
inline std::string Ipv6LoopbackMissing() {
  const int fd = socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return std::string("no IPv6 sockets here: ") + std::strerror(errno);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  const int err = errno;
  close(fd);
  return ok ? "" : std::string("cannot bind [::1]: ") + std::strerror(err);
}

// A child process running `argv` (argv[0] a path) with exactly `env`, its
// stdout and stderr into the file `log`; SIGKILLed (by its PID) and reaped at
// the end if it still runs. Everything the child needs is prepared before the
// fork, so the child only dups and execs.
class LoggedProcess {
 public:
  LoggedProcess(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                const std::string& log)
      : log_(log) {
    std::vector<std::string> args = argv, envs;
    for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
    std::vector<char*> argp, envp;
    for (std::string& a : args) argp.push_back(a.data());
    for (std::string& e : envs) envp.push_back(e.data());
    argp.push_back(nullptr);
    envp.push_back(nullptr);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || args.empty()) {
      ADD_FAILURE() << "cannot start " << (args.empty() ? "nothing" : args[0]) << " logging to "
                    << log;
      if (fd >= 0) close(fd);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execve(argp[0], argp.data(), envp.data());
      _exit(127);
    }
    close(fd);
  }
  ~LoggedProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  LoggedProcess(const LoggedProcess&) = delete;
  LoggedProcess& operator=(const LoggedProcess&) = delete;

  // Exit code (128 + signal when killed), or -1 if still running after `seconds`.
  int Wait(double seconds) {
    if (exited_) return code_;
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    do {
      int status = 0;
      if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
        exited_ = true;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        return code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < end);
    return -1;
  }
  void Kill9() {
    if (pid_ > 0 && !exited_) kill(pid_, SIGKILL);
  }
  pid_t pid() const { return pid_; }
  std::string Log() const { return ReadFile(log_); }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int code_ = -1;
  std::string log_;
};

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_TEST_UTIL_H_
