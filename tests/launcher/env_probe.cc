// env_probe: the job the launcher tests run. It checks in with its
// "scheduler" over TCP at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT, writes what it
// saw (role, rank, environment, arguments, pid, cwd) to <out>/<role>-<rank>.txt,
// and prints MXNet-style epoch lines (workers) for the log tests.
//
//   env_probe --out=DIR [--sleep=SECONDS] [--fail=ROLE:RANK:CODE] [--show=VAR,...]
//             [--stdin-wait-ms=MS] [ARGS...]
//
// --fail makes that one process exit with CODE once every process has written
// its report. --stdin-wait-ms adds "stdin=eof|data|open|error" to the report:
// what its stdin gave within MS milliseconds (open: neither data nor its end),
// and "parent_stdin=" the same for its parent's stdin.
// As scheduler it accepts DMLC_NUM_SERVER + DMLC_NUM_WORKER connections and
// exits only after all of them have closed (the others have exited), so the
// job ends with the scheduler, as in MXNet. Every wait is bounded.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"

namespace {

using pstrain::Deadline;

constexpr int kWaitMs = 60000;

int Die(const std::string& what) {
  std::fprintf(stderr, "env_probe: %s\n", what.c_str());
  return 4;
}

sockaddr_in Address(const std::string& ip, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  return a;
}

// Accepts `n` check-ins, then waits until every one of them has closed.
bool RunScheduler(const pstrain::JobEnv& job, int n, std::string* error) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a = Address(job.root_uri, job.root_port);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 64) != 0) {
    *error = "scheduler cannot listen on " + job.root_uri + ":" + std::to_string(job.root_port) +
             ": " + std::strerror(errno);
    return false;
  }
  std::vector<pollfd> peers;
  int accepted = 0;
  Deadline deadline = Deadline::InMillis(kWaitMs);
  while (accepted < n || !peers.empty()) {
    if (deadline.Expired()) {
      *error = "scheduler: only " + std::to_string(accepted) + " of " + std::to_string(n) +
               " checked in, " + std::to_string(peers.size()) + " still connected";
      return false;
    }
    std::vector<pollfd> fds = peers;
    fds.push_back({fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 200);
    if (fds.back().revents & POLLIN) {
      int c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c >= 0) {
        peers.push_back({c, POLLIN, 0});
        ++accepted;
      }
    }
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[256];
      ssize_t r = read(fds[i].fd, buf, sizeof(buf));
      if (r <= 0) {
        close(fds[i].fd);
        for (size_t k = 0; k < peers.size(); ++k) {
          if (peers[k].fd == fds[i].fd) peers.erase(peers.begin() + static_cast<long>(k));
        }
      } else {
        std::fwrite(buf, 1, static_cast<size_t>(r), stdout);
        std::fflush(stdout);
      }
    }
  }
  close(fd);
  return true;
}

int CheckIn(const pstrain::JobEnv& job, const std::string& hello, std::string* error) {
  Deadline deadline = Deadline::InMillis(kWaitMs);
  while (!deadline.Expired()) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = Address(job.root_uri, job.root_port);
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      if (write(fd, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size())) return fd;
    }
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  *error = "cannot reach the scheduler at " + job.root_uri + ":" + std::to_string(job.root_port);
  return -1;
}

size_t CountReports(const std::string& dir) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.size() > 4 && name.compare(name.size() - 4, 4, ".txt") == 0) ++n;
    }
    closedir(d);
  }
  return n;
}

// What `fd` gives within `wait_ms`: "eof", "data", "open" (nothing yet), or
// "error" (a read that failed, as on a closed descriptor).
std::string InputState(int fd, int wait_ms) {
  pollfd p = {fd, POLLIN, 0};
  if (poll(&p, 1, wait_ms) <= 0) return "open";
  char c = 0;
  ssize_t got = read(fd, &c, 1);
  return got > 0 ? "data" : got == 0 ? "eof" : "error";
}

// The same for the parent's stdin, opened anew through /proc ("none" when it
// cannot be): under MPICH the parent is the launcher's rank wrapper, whose
// stdin is what mpirun forwarded (the wrapper's `cmd &` gets /dev/null).
std::string ParentInputState(int wait_ms) {
  const std::string path = "/proc/" + std::to_string(getppid()) + "/fd/0";
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "none";
  std::string state = InputState(fd, wait_ms);
  close(fd);
  return state;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_dir, fail, show;
  double sleep_s = 0;
  int stdin_wait_ms = -1;
  std::vector<std::string> extra;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--out=", 0) == 0) {
      out_dir = a.substr(6);
    } else if (a.rfind("--sleep=", 0) == 0) {
      sleep_s = std::atof(a.c_str() + 8);
    } else if (a.rfind("--fail=", 0) == 0) {
      fail = a.substr(7);
    } else if (a.rfind("--show=", 0) == 0) {
      show = a.substr(7);
    } else if (a.rfind("--stdin-wait-ms=", 0) == 0) {
      stdin_wait_ms = std::atoi(a.c_str() + 16);
    } else {
      extra.push_back(a);
    }
  }
  if (out_dir.empty()) return Die("--out=DIR is required");
  pstrain::Environment env;
  auto job = pstrain::ReadJobEnv(env);
  if (!job.ok()) return Die(job.status().ToString());
  auto info = pstrain::ReadLaunchInfo(env);
  if (!info.ok()) return Die(info.status().ToString());
  std::string role = pstrain::RoleName(job->role);
  int rank = info->role_rank;
  std::string name = role + "-" + std::to_string(rank);

  char cwd[4096] = "?";
  if (getcwd(cwd, sizeof(cwd)) == nullptr) cwd[0] = '\0';
  std::string report;
  report += "role=" + role + "\nrank=" + std::to_string(rank) +
            "\npid=" + std::to_string(getpid()) + "\ncwd=" + cwd + "\n";
  report += "DMLC_PS_ROOT_URI=" + job->root_uri + "\n";
  report += "DMLC_PS_ROOT_PORT=" + std::to_string(job->root_port) + "\n";
  report += "DMLC_NUM_SERVER=" + std::to_string(job->num_servers) + "\n";
  report += "DMLC_NUM_WORKER=" + std::to_string(job->num_workers) + "\n";
  report += "DMLC_NODE_HOST=" + job->node_host + "\n";
  report += "DMLC_TASK_ID=" + std::to_string(info->task_id) + "\n";
  report += "DMLC_JOB_CLUSTER=" + info->cluster + "\n";
  report += "PSTRAIN_JOB_ID=" + info->job_id + "\n";
  size_t start = 0;
  while (!show.empty() && start <= show.size()) {
    size_t comma = show.find(',', start);
    if (comma == std::string::npos) comma = show.size();
    std::string var = show.substr(start, comma - start);
    report += var + "=" + env.Get(var).value_or("<unset>") + "\n";
    start = comma + 1;
  }
  for (size_t i = 0; i < extra.size(); ++i) {
    report += "arg" + std::to_string(i) + "=" + extra[i] + "\n";
  }
  if (stdin_wait_ms >= 0) {
    report += "stdin=" + InputState(STDIN_FILENO, stdin_wait_ms) + "\n";
    report += "parent_stdin=" + ParentInputState(stdin_wait_ms) + "\n";
  }

  std::string error;
  int conn = -1;
  if (job->role == pstrain::Role::kScheduler) {
    std::printf("scheduler listening on %s:%d\n", job->root_uri.c_str(), job->root_port);
    std::fflush(stdout);
  } else {
    conn = CheckIn(*job, name + " checked in\n", &error);
    if (conn < 0) return Die(error);
  }
  {
    std::string path = out_dir + "/" + name + ".txt";
    std::ofstream f(path + ".tmp");
    f << report;
    f.close();
    if (!f || std::rename((path + ".tmp").c_str(), path.c_str()) != 0) {
      return Die("cannot write " + path);
    }
  }
  std::printf("%s: pid %d ready\n", name.c_str(), static_cast<int>(getpid()));
  std::fflush(stdout);
  if (job->role == pstrain::Role::kWorker) {
    for (int e = 0; e < 2; ++e) {
      double acc = 0.5 + 0.1 * e + 0.01 * rank;
      std::fprintf(stderr,
                   "INFO:root:Epoch[%d] Batch [10]\tSpeed: 100.00 samples/sec\taccuracy=%f\n", e,
                   acc);
      std::fprintf(stderr, "INFO:root:Epoch[%d] Train-accuracy=%f\n", e, acc);
      std::fprintf(stderr, "INFO:root:Epoch[%d] Time cost=%.3f\n", e, 1.5 + rank);
      std::fprintf(stderr, "INFO:root:Epoch[%d] Validation-accuracy=%f\n", e, acc - 0.05);
    }
  }
  if (!fail.empty()) {
    std::string want_role = fail.substr(0, fail.find(':'));
    std::string rest = fail.substr(fail.find(':') + 1);
    int want_rank = std::atoi(rest.c_str());
    int code = std::atoi(rest.substr(rest.find(':') + 1).c_str());
    if (want_role == role && want_rank == rank) {
      // Fail only once every process has reported, so the test knows all pids.
      size_t everyone = static_cast<size_t>(1 + job->num_servers + job->num_workers);
      Deadline deadline = Deadline::InMillis(kWaitMs);
      while (CountReports(out_dir) < everyone && !deadline.Expired()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::fprintf(stderr, "%s: failing with exit code %d as asked\n", name.c_str(), code);
      return code;
    }
  }
  if (job->role == pstrain::Role::kScheduler) {
    if (!RunScheduler(*job, job->num_servers + job->num_workers, &error)) return Die(error);
    std::printf("scheduler: everyone has exited\n");
    return 0;
  }
  if (sleep_s > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(sleep_s * 1000)));
  }
  close(conn);
  return 0;
}
