// Helpers for the launcher tests: temporary directories, running
// `pstrain launch` as a child with a deadline, reading env_probe reports and
// checking that processes are gone.
#ifndef PSTRAIN_TESTS_LAUNCHER_LAUNCH_TEST_UTIL_H_
#define PSTRAIN_TESTS_LAUNCHER_LAUNCH_TEST_UTIL_H_

#include <dirent.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "tests/test_util.h"
#include "tracker/process.h"

namespace pstrain::testing {

inline std::string EnvProbe() { return ENV_PROBE; }

inline void WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// <dir>/<role>-<rank>.txt reports: name -> key -> value.
using Reports = std::map<std::string, std::map<std::string, std::string>>;
inline Reports ReadReports(const std::string& dir) {
  Reports reports;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return reports;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name.size() < 5 || name.compare(name.size() - 4, 4, ".txt") != 0) continue;
    std::istringstream in(ReadFile(dir + "/" + name));
    std::string line;
    auto& kv = reports[name.substr(0, name.size() - 4)];
    while (std::getline(in, line)) {
      size_t eq = line.find('=');
      if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  closedir(d);
  return reports;
}

// True when `pid` no longer runs (gone, or a zombie nobody has reaped yet).
inline bool ProcessGone(int pid) {
  if (kill(pid, 0) != 0) return true;
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

// The pids of the reports that are still running after `grace_ms`.
inline std::vector<std::string> Survivors(const Reports& reports, int grace_ms = 2000) {
  Deadline deadline = Deadline::InMillis(grace_ms);
  std::vector<std::string> alive;
  do {
    alive.clear();
    for (const auto& [name, kv] : reports) {
      auto it = kv.find("pid");
      if (it != kv.end() && !ProcessGone(std::atoi(it->second.c_str()))) {
        alive.push_back(name + " pid " + it->second);
      }
    }
    if (alive.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (!deadline.Expired());
  return alive;
}

struct LaunchRun {
  int wait_status = -1;
  std::string output;  // stdout and stderr of the launcher, interleaved
  double seconds = 0;
  int exit_code() const { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }
};

// A `pstrain launch` child whose output is drained while the test waits.
class Launch {
 public:
  Launch(const std::vector<std::string>& args, const std::string& cwd,
         std::map<std::string, std::string> extra_env = {}) {
    tracker::ProcessSpec spec;
    spec.argv = {PstrainBinary(), "launch"};
    spec.argv.insert(spec.argv.end(), args.begin(), args.end());
    spec.env = Environment().All();
    for (auto& [k, v] : extra_env) spec.env[k] = v;
    spec.cwd = cwd;
    start_ = std::chrono::steady_clock::now();
    auto p = tracker::Subprocess::Start(spec);
    EXPECT_TRUE(p.ok()) << p.status();
    if (p.ok()) proc_ = std::move(p).value();
  }

  // Drains output until `done()` or the deadline; returns done()'s last value.
  bool PumpUntil(const std::function<bool()>& done, int timeout_ms) {
    Deadline deadline = Deadline::InMillis(timeout_ms);
    while (!done()) {
      if (deadline.Expired() || proc_ == nullptr) return false;
      Pump(50);
    }
    return true;
  }

  // Waits for the launcher to exit (killing it past the deadline).
  LaunchRun Wait(int timeout_ms) {
    LaunchRun run;
    if (proc_ == nullptr) return run;
    bool exited = PumpUntil(
        [this] { return proc_->Poll() && proc_->stdout_fd() < 0 && proc_->stderr_fd() < 0; },
        timeout_ms);
    if (!exited) {
      ADD_FAILURE() << "pstrain launch did not exit within " << timeout_ms << " ms; output:\n"
                    << output_;
      proc_.reset();
      return run;
    }
    run.wait_status = proc_->wait_status();
    run.output = output_;
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    return run;
  }

  int pid() const { return proc_ ? proc_->pid() : -1; }
  const std::string& output() const { return output_; }

 private:
  void Pump(int timeout_ms) {
    std::vector<pollfd> fds;
    for (int fd : {proc_->stdout_fd(), proc_->stderr_fd()}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return;
    }
    poll(fds.data(), fds.size(), timeout_ms);
    for (const pollfd& f : fds) {
      if (f.revents == 0) continue;
      char buf[8192];
      ssize_t n = read(f.fd, buf, sizeof(buf));
      if (n > 0) {
        output_.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (f.fd == proc_->stdout_fd()) {
          proc_->CloseStdout();
        } else {
          proc_->CloseStderr();
        }
      }
    }
  }

  std::unique_ptr<tracker::Subprocess> proc_;
  std::string output_;
  std::chrono::steady_clock::time_point start_;
};

inline LaunchRun RunLaunch(const std::vector<std::string>& args, const std::string& cwd,
                           int timeout_ms, std::map<std::string, std::string> extra_env = {}) {
  Launch launch(args, cwd, std::move(extra_env));
  return launch.Wait(timeout_ms);
}

// Tricky values the tests pass through --env and as arguments.
inline const std::string kSpacey = "two  words, 'single' \"double\" $HOME `id` \\ ; & |";

// Checks the reports of a finished job with `s` servers and `w` workers: one
// scheduler, every role/rank once, and the cluster variables.
inline void ExpectJobReports(const Reports& reports, int s, int w, const std::string& cluster) {
  ASSERT_EQ(reports.size(), static_cast<size_t>(1 + s + w)) << "reports from every process";
  std::string uri, port, job_id;
  for (int i = 0; i < 1 + s + w; ++i) {
    std::string name = i == 0   ? "scheduler-0"
                       : i <= s ? "server-" + std::to_string(i - 1)
                                : "worker-" + std::to_string(i - 1 - s);
    SCOPED_TRACE(name);
    auto it = reports.find(name);
    ASSERT_NE(it, reports.end()) << "no report from " << name;
    const auto& kv = it->second;
    EXPECT_EQ(kv.at("role"), name.substr(0, name.find('-')));
    EXPECT_EQ(kv.at("DMLC_NUM_SERVER"), std::to_string(s));
    EXPECT_EQ(kv.at("DMLC_NUM_WORKER"), std::to_string(w));
    EXPECT_EQ(kv.at("DMLC_JOB_CLUSTER"), cluster);
    if (i == 0) {
      uri = kv.at("DMLC_PS_ROOT_URI");
      port = kv.at("DMLC_PS_ROOT_PORT");
      job_id = kv.at("PSTRAIN_JOB_ID");
      EXPECT_FALSE(uri.empty());
      EXPECT_NE(port, "0");
      EXPECT_FALSE(job_id.empty());
    } else {
      EXPECT_EQ(kv.at("DMLC_PS_ROOT_URI"), uri);
      EXPECT_EQ(kv.at("DMLC_PS_ROOT_PORT"), port);
      EXPECT_EQ(kv.at("PSTRAIN_JOB_ID"), job_id);
    }
  }
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_LAUNCHER_LAUNCH_TEST_UTIL_H_
