#include "tracker/process.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/deadline.h"
#include "common/fd_io.h"

namespace pstrain::tracker {
namespace {

void CloseFd(int* fd) {
  if (*fd >= 0) {
    close(*fd);
    *fd = -1;
  }
}

}  // namespace

StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(const ProcessSpec& spec) {
  if (spec.argv.empty()) return Status::InvalidArgument("empty command");
  // Everything the child needs is prepared before fork: after it only
  // async-signal-safe calls are allowed.
  std::vector<char*> argv;
  for (const std::string& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : spec.env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (std::string& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1},
      exec_pipe[2] = {-1, -1};
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
      pipe2(exec_pipe, O_CLOEXEC) != 0 || (spec.pipe_stdin && pipe2(in_pipe, O_CLOEXEC) != 0)) {
    const Status error = Status::IOError(StrCat("pipe: ", strerror(errno)));
    for (int* fds : {in_pipe, out_pipe, err_pipe, exec_pipe}) {
      for (int i = 0; i < 2; ++i) CloseFd(&fds[i]);
    }
    return error;
  }
  // With SIGCHLD ignored (inherited: `trap '' CHLD`, some daemons) or
  // SA_NOCLDWAIT, the kernel reaps children unasked and no exit status can
  // be read; children are waited for here, so that is undone (for the whole
  // process, and for what the child runs: an ignored signal survives exec).
  struct sigaction chld = {};
  if (sigaction(SIGCHLD, nullptr, &chld) == 0 &&
      ((chld.sa_flags & SA_SIGINFO) == 0 && chld.sa_handler == SIG_IGN)) {
    signal(SIGCHLD, SIG_DFL);
  } else if ((chld.sa_flags & SA_NOCLDWAIT) != 0) {
    chld.sa_flags &= ~SA_NOCLDWAIT;
    sigaction(SIGCHLD, &chld, nullptr);
  }
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    const Status error =
        Status::IOError(StrCat("fork for '", spec.argv[0], "': ", strerror(errno)));
    for (int* fds : {in_pipe, out_pipe, err_pipe, exec_pipe}) {
      for (int i = 0; i < 2; ++i) CloseFd(&fds[i]);
    }
    return error;
  }
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl
    int in = spec.pipe_stdin ? in_pipe[0] : open("/dev/null", O_RDONLY);
    dup2(in, STDIN_FILENO);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (!spec.cwd.empty() && chdir(spec.cwd.c_str()) != 0) {
      int err = errno;
      WriteAll(exec_pipe[1], "c", 1);
      WriteAll(exec_pipe[1], &err, sizeof(err));
      _exit(127);
    }
    execvpe(argv[0], argv.data(), envp.data());
    int err = errno;
    WriteAll(exec_pipe[1], "e", 1);
    WriteAll(exec_pipe[1], &err, sizeof(err));
    _exit(127);
  }
  // Also in the parent, so that a signal sent right after Start reaches the group.
  setpgid(pid, pid);
  std::unique_ptr<Subprocess> p(new Subprocess());
  p->pid_ = pid;
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  if (spec.pipe_stdin) {
    close(in_pipe[0]);
    p->in_fd_ = in_pipe[1];
  }
  p->out_fd_ = out_pipe[0];
  p->err_fd_ = err_pipe[0];
  fcntl(p->out_fd_, F_SETFL, O_NONBLOCK);
  fcntl(p->err_fd_, F_SETFL, O_NONBLOCK);

  char what = 0;
  int err = 0;
  ssize_t n;
  do {
    n = read(exec_pipe[0], &what, 1);
  } while (n < 0 && errno == EINTR);
  if (n == 1) {
    ssize_t m;
    do {
      m = read(exec_pipe[0], &err, sizeof(err));
    } while (m < 0 && errno == EINTR);
  }
  close(exec_pipe[0]);
  if (n == 1) {
    waitpid(pid, nullptr, 0);
    p->exited_ = true;
    if (what == 'c') {
      return Status::NotFound(StrCat("cannot change to directory '", spec.cwd, "' to run '",
                                     spec.argv[0], "': ", strerror(err)));
    }
    return Status::NotFound(StrCat("cannot execute '", spec.argv[0], "': ", strerror(err)));
  }
  // Once it runs (a child that could not start would get it in vain), and
  // safe from SIGPIPE if it ends without reading.
  if (spec.pipe_stdin && !spec.stdin_data.empty()) (void)p->WriteStdin(spec.stdin_data);
  return p;
}

Subprocess::~Subprocess() {
  if (!exited_ && pid_ > 0) {
    kill(-pid_, SIGKILL);
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  CloseFd(&in_fd_);
  CloseFd(&out_fd_);
  CloseFd(&err_fd_);
}

void Subprocess::CloseStdout() { CloseFd(&out_fd_); }
void Subprocess::CloseStderr() { CloseFd(&err_fd_); }
void Subprocess::CloseStdin() { CloseFd(&in_fd_); }

bool Subprocess::WriteStdin(const std::string& data) {
  if (in_fd_ < 0) return false;
  // A pipe whose reader is gone raises SIGPIPE in the writing thread: block it
  // around the write and take back one that this write raised, so that a
  // library caller's process is not killed by a child that ended first.
  sigset_t pipe_set, old_set;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
  const bool ok = WriteAll(in_fd_, data);
  if (!ok && errno == EPIPE && !was_pending) {
    const timespec zero = {0, 0};
    while (sigtimedwait(&pipe_set, nullptr, &zero) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
  return ok;
}

bool Subprocess::Poll(bool wait_for_group) {
  if (exited_) return true;
  // WNOWAIT: an exited child stays a zombie, holding its pid and so its
  // group's id, while what it left in its group is killed; only then is it
  // reaped (after which the id could name another process's group).
  siginfo_t info = {};
  if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    if (errno == ECHILD) {
      // Reaped elsewhere; nothing more can be learnt about it.
      exited_ = true;
      wait_status_ = 0xff00;  // "exited with code 255"
    }
    return exited_;
  }
  if (info.si_pid != pid_) return false;  // still running
  if (wait_for_group && GroupHasLiveProcess(pid_, pid_)) return false;
  kill(-pid_, SIGKILL);  // ESRCH when the group is empty
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, 0);  // at once: it has exited
  } while (r < 0 && errno == EINTR);
  exited_ = true;
  wait_status_ = r == pid_ ? status : 0xff00;
  return true;
}

bool Subprocess::succeeded() const {
  return WIFEXITED(wait_status_) && WEXITSTATUS(wait_status_) == 0;
}

std::string Subprocess::ExitDescription() const {
  if (WIFEXITED(wait_status_)) return StrCat("exited with code ", WEXITSTATUS(wait_status_));
  if (WIFSIGNALED(wait_status_)) {
    int sig = WTERMSIG(wait_status_);
    return StrCat("killed by signal ", sig, " (", strsignal(sig), ")");
  }
  return StrCat("ended with wait status ", wait_status_);
}

void Subprocess::SignalGroup(int sig) {
  if (exited_ || pid_ <= 0) return;
  if (kill(-pid_, sig) != 0) kill(pid_, sig);
}

Status RunAndCapture(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, int timeout_ms,
                     std::string* output, int* wait_status, int stop_fd, int* stop_signal) {
  std::vector<CapturedRun> results;
  RETURN_IF_ERROR(RunAllAndCapture({argv}, env, timeout_ms, 1, &results, stop_fd, stop_signal));
  *output = std::move(results[0].output);
  *wait_status = results[0].wait_status;
  return results[0].status;
}

Status RunAllAndCapture(const std::vector<std::vector<std::string>>& argvs,
                        const std::map<std::string, std::string>& env, int timeout_ms,
                        int max_parallel, std::vector<CapturedRun>* results, int stop_fd,
                        int* stop_signal) {
  results->assign(argvs.size(), CapturedRun());
  struct Running {
    size_t index;
    std::unique_ptr<Subprocess> process;
    Deadline deadline;
  };
  std::vector<Running> running;  // what is left running when this returns is killed
  size_t next = 0;
  bool watch_stop = stop_fd >= 0;
  char buf[4096];
  while (next < argvs.size() || !running.empty()) {
    while (next < argvs.size() && static_cast<int>(running.size()) < std::max(1, max_parallel)) {
      ProcessSpec spec;
      spec.argv = argvs[next];
      spec.env = env;
      auto started = Subprocess::Start(spec);
      if (started.ok()) {
        running.push_back({next, std::move(*started), Deadline::InMillis(timeout_ms)});
      } else {
        (*results)[next].status = started.status();
      }
      ++next;
    }
    // Ended (both pipes closed and exited) or out of time.
    bool awaiting_exit = false;
    int64_t wait_ms = 100;
    for (auto it = running.begin(); it != running.end();) {
      Subprocess& p = *it->process;
      CapturedRun& result = (*results)[it->index];
      const bool pipes_closed = p.stdout_fd() < 0 && p.stderr_fd() < 0;
      if (pipes_closed && p.Poll()) {
        result.wait_status = p.wait_status();
        it = running.erase(it);
      } else if (it->deadline.Expired()) {
        result.status = Status::DeadlineExceeded(
            StrCat("'", argvs[it->index][0], "' did not finish within ", timeout_ms, " ms"));
        it = running.erase(it);  // kills its process group
      } else {
        awaiting_exit = awaiting_exit || pipes_closed;
        wait_ms = std::min(wait_ms, it->deadline.RemainingMillis());
        ++it;
      }
    }
    if (running.empty()) continue;
    // With a child's pipes closed only its exit is awaited: poll briefly.
    if (awaiting_exit) wait_ms = std::min<int64_t>(wait_ms, 10);
    std::vector<pollfd> fds;
    std::vector<size_t> owner;  // index into `running` of each output fd
    for (size_t i = 0; i < running.size(); ++i) {
      for (int fd : {running[i].process->stdout_fd(), running[i].process->stderr_fd()}) {
        if (fd < 0) continue;
        fds.push_back({fd, POLLIN, 0});
        owner.push_back(i);
      }
    }
    const size_t outputs = fds.size();
    if (watch_stop) fds.push_back({stop_fd, POLLIN, 0});
    poll(fds.data(), static_cast<nfds_t>(fds.size()),
         static_cast<int>(std::max<int64_t>(0, wait_ms)));
    if (watch_stop && fds.back().revents != 0) {
      unsigned char sig = 0;
      const ssize_t n = read(stop_fd, &sig, 1);
      if (n == 1) {
        if (stop_signal != nullptr) *stop_signal = sig;
        const Status stopped =
            Status::Cancelled(StrCat("'", argvs[running.front().index][0], "' was stopped (",
                                     sig != 0 ? SignalName(sig) : "stop requested", ")"));
        // What was running is killed (`running` goes), what never started
        // did not run: neither reads as a success.
        for (const Running& r : running) (*results)[r.index].status = stopped;
        for (size_t i = next; i < argvs.size(); ++i) (*results)[i].status = stopped;
        return stopped;
      }
      // The stop pipe's writer is gone (end of file): nothing can ask any
      // more, and a closed pipe would wake every poll.
      if (n == 0) watch_stop = false;
    }
    for (size_t i = 0; i < outputs; ++i) {
      if (fds[i].revents == 0) continue;
      Subprocess& p = *running[owner[i]].process;
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        (*results)[running[owner[i]].index].output.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (fds[i].fd == p.stdout_fd()) {
          p.CloseStdout();
        } else {
          p.CloseStderr();
        }
      }
    }
  }
  return Status::Ok();
}

bool ReadProcStat(int pid, char* state, int* pgrp) {
  std::ifstream stat(StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(") ");
  if (paren == std::string::npos) return false;
  int ppid = 0;
  return std::sscanf(line.c_str() + paren + 2, "%c %d %d", state, &ppid, pgrp) == 3;
}

namespace {

// Whether a process of group `pgid` other than `except` is in a state that
// `match` accepts; true when /proc cannot be read.
template <typename Match>
bool GroupHas(int pgid, int except, Match match) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return true;  // cannot tell: assume one is
  bool found = false;
  while (const dirent* e = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || pid == except) continue;
    char state = 0;
    int pgrp = 0;
    if (ReadProcStat(static_cast<int>(pid), &state, &pgrp) && pgrp == pgid && match(state)) {
      found = true;
      break;
    }
  }
  closedir(proc);
  return found;
}

}  // namespace

bool GroupHasStoppedProcess(int pgid) {
  return GroupHas(pgid, -1, [](char state) { return state == 'T'; });
}

bool GroupHasLiveProcess(int pgid, int except) {
  return GroupHas(pgid, except, [](char state) { return state != 'Z' && state != 'X'; });
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? StrCat("SIG", abbrev) : StrCat("signal ", sig);
}

}  // namespace pstrain::tracker
