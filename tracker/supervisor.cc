#include "tracker/supervisor.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string_view>

#include "common/fd_io.h"
#include "common/job_cause.h"

namespace pstrain::tracker {
namespace {

constexpr size_t kMaxLine = 64 * 1024;  // a longer "line" is cut and forwarded in pieces
constexpr int kDrainMs = 1000;          // output still arriving after every process exited

Status MakeDirs(const std::string& path) {
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      return Status::IOError(
          StrCat("cannot create log directory '", partial, "': ", strerror(errno)));
    }
  }
  return Status::Ok();
}

// "<scheduler|server|worker>-<digits>", the name of a process's log.
bool IsProcessLogName(std::string_view name) {
  for (std::string_view role : {"scheduler-", "server-", "worker-"}) {
    if (name.substr(0, role.size()) != role || name.size() == role.size()) continue;
    const std::string_view digits = name.substr(role.size());
    return digits.find_first_not_of("0123456789") == std::string_view::npos;
  }
  return false;
}

// Log files, one per <role>-<rank>, written from the job's start.
class LogSink {
 public:
  explicit LogSink(std::string dir) : dir_(std::move(dir)) {}
  ~LogSink() {
    for (auto& [name, fd] : files_) close(fd);
  }
  // Before the job: every log of `names` starts empty (a process that never
  // writes leaves no earlier job's lines under its name), and a process log
  // of an earlier job that this one has no process for is removed (parse-log
  // and top read every worker-*.log of the folder). Returns the removed names.
  std::vector<std::string> Prepare(const std::set<std::string>& names) {
    std::vector<std::string> removed;
    if (DIR* d = opendir(dir_.c_str())) {
      while (dirent* ent = readdir(d)) {
        const std::string file = ent->d_name;
        if (file.size() <= 4 || file.compare(file.size() - 4, 4, ".log") != 0) continue;
        const std::string name = file.substr(0, file.size() - 4);
        if (!IsProcessLogName(name) || names.count(name) > 0) continue;
        if (unlink((dir_ + "/" + file).c_str()) == 0) removed.push_back(file);
      }
      closedir(d);
    }
    std::sort(removed.begin(), removed.end());
    for (const std::string& name : names) Open(name);
    return removed;
  }
  void Write(const std::string& name, const std::string& text) {
    auto it = files_.find(name);
    if (it == files_.end()) it = Open(name);
    if (it->second >= 0) WriteAll(it->second, text);
  }

 private:
  std::map<std::string, int>::iterator Open(const std::string& name) {
    auto it = files_.find(name);
    if (it != files_.end()) return it;
    std::string path = dir_ + "/" + name + ".log";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
      WriteAll(2, StrCat("pstrain launch: cannot write '", path, "': ", strerror(errno), "\n"));
    }
    return files_.emplace(name, fd).first;
  }

 private:
  std::string dir_;
  std::map<std::string, int> files_;
};

struct Running {
  Task task;
  std::unique_ptr<Subprocess> proc;
  std::string pending[2];  // partial last line of stdout, stderr
  bool signalled = false;
  int failed_rank = -1;      // groups: the rank mpirun reported as the first to fail
  std::string last_error{};  // srun groups: srun's last "srun: error:" line
  int restarts = 0;          // how many times the task's process was started again
};

// Open MPI's abort notice names the failed process "Process name: [[job,1],RANK]".
int FailedRankFromNotice(const std::string& line) {
  size_t at = line.find("Process name: [[");
  if (at == std::string::npos) return -1;
  size_t comma = line.find("],", at);
  if (comma == std::string::npos) return -1;
  int rank = std::atoi(line.c_str() + comma + 2);
  return rank >= 0 ? rank : -1;
}

class Job {
 public:
  Job(const SupervisorOptions& options) : options_(options), logs_(options.log_dir) {}

  StatusOr<JobResult> Run(std::vector<Task> tasks) {
    std::set<std::string> names;
    for (const Task& t : tasks) {
      if (t.tags == OutputTags::kNone) {
        names.insert(Name(t, t.rank));
      } else {
        names.insert(t.rank_names.begin(), t.rank_names.end());
        names.insert(t.role);  // the group's own lines
      }
    }
    const std::vector<std::string> removed = logs_.Prepare(names);
    if (!removed.empty()) {
      std::string list;
      for (const std::string& f : removed) list += StrCat(list.empty() ? "" : ", ", f);
      Notice(
          StrCat("pstrain launch: removed the logs of an earlier job's processes that this job "
                 "does not have from ",
                 options_.log_dir, ": ", list, "\n"));
    }
    result_.restarted_pids.reserve(tasks.size());
    for (Task& t : tasks) {
      auto proc = Subprocess::Start(t.spec);
      if (!proc.ok()) {
        StopAll();
        WaitAllExited(Deadline::InMillis(options_.term_grace_ms + 2000));
        return proc.status().WithContext(StrCat("starting ", Name(t, t.rank), " on ", t.host));
      }
      result_.pids.push_back((*proc)->pid());
      result_.restarted_pids.emplace_back();
      running_.push_back(Running{std::move(t), std::move(proc).value(), {}, false});
      ObserveStart(running_.back());
    }
    Loop();
    return result_;
  }

 private:
  static std::string Name(const Task& t, int rank) { return StrCat(t.role, "-", rank); }
  static std::string RankName(const Task& t, int rank) {
    return static_cast<size_t>(rank) < t.rank_names.size() ? t.rank_names[rank] : Name(t, rank);
  }

  // A line of the launcher's own for the terminal's stderr.
  void Notice(const std::string& text) {
    if (options_.observer != nullptr && options_.observer->OnNotice(text)) return;
    WriteAll(options_.terminal_err_fd, text);
  }

  // The names the observer knows `r`'s process(es) by: a group's ranks and
  // the group itself ("mpirun", whose own lines go by that name).
  static std::vector<std::string> ObservedNames(const Running& r) {
    if (r.task.tags == OutputTags::kNone) return {Name(r.task, r.task.rank)};
    std::vector<std::string> names = r.task.rank_names;
    names.push_back(r.task.role);
    return names;
  }

  void ObserveStart(const Running& r) {
    if (options_.observer == nullptr) return;
    for (const std::string& name : ObservedNames(r)) {
      options_.observer->OnStart(name, r.task.host, r.proc->pid());
    }
  }

  void ObserveExit(const Running& r) {
    if (options_.observer == nullptr) return;
    for (const std::string& name : ObservedNames(r)) {
      options_.observer->OnExit(name, r.proc->wait_status(), r.signalled);
    }
  }

  // Output of one read, batched so that a run of lines for the same process
  // costs one write to its log file and one to the terminal.
  struct Batch {
    std::string name;
    std::string log;
    std::string terminal;
  };

  void FlushBatch(Batch& b, int stream) {
    if (b.log.empty()) return;
    logs_.Write(b.name, b.log);
    if (options_.echo) {
      WriteAll(stream == 0 ? options_.terminal_out_fd : options_.terminal_err_fd, b.terminal);
    }
    b.log.clear();
    b.terminal.clear();
  }

  // Adds one complete line (with its newline) of task `r` to `b`.
  void AddLine(Running& r, int stream, std::string_view line, Batch& b) {
    std::string name;
    std::string_view text = line;
    std::string stripped;
    if (r.task.tags == OutputTags::kNone) {
      if (b.name.empty()) b.name = Name(r.task, r.task.rank);
      name = b.name;
    } else {
      int rank = 0;
      std::string whole(line);
      if (SplitRankTag(r.task.tags, whole, &rank, &stripped)) {
        name = RankName(r.task, rank);
        text = stripped;
        const std::string marker = kMpiRankFailedMarker;
        if (text.compare(0, marker.size(), marker) == 0 && !stopping_) {
          std::string code(text.substr(marker.size()));
          while (!code.empty() && (code.back() == '\n' || code.back() == '\r')) code.pop_back();
          FlushBatch(b, stream);  // what came before it stays before it in the logs
          logs_.Write(name, std::string(text));
          Fail(StrCat(name, " (MPI rank ", rank, ") under ", r.task.role, " (", r.task.host,
                      ") exited with code ", code),
               1);
          reason_from_exit_ = true;
          return;
        }
      } else {
        name = r.task.role;
        if (int failed = FailedRankFromNotice(whole); failed >= 0) r.failed_rank = failed;
        if (r.task.tags == OutputTags::kSlurm) SrunNotice(r, whole, stream, b);
      }
    }
    NoteCause(name, text);
    if (options_.observer != nullptr) {
      std::string_view bare = text;
      if (!bare.empty() && bare.back() == '\n') bare.remove_suffix(1);
      if (!bare.empty() && bare.back() == '\r') bare.remove_suffix(1);
      options_.observer->OnLine(name, stream, bare);
    }
    if (name != b.name) {
      FlushBatch(b, stream);
      b.name = name;
    }
    b.log.append(text);
    if (options_.echo) {
      b.terminal.append("[").append(name).append("] ").append(text);
    }
  }

  // srun's own line `line` of group `r` (it goes on to the group's log): a
  // task notice fails the job at once, naming the task's process, whose log
  // gets the line too; other errors are kept for the reason should srun
  // itself fail.
  void SrunNotice(Running& r, const std::string& line, int stream, Batch& b) {
    int task = -1;
    std::string node, what;
    if (!ParseSrunTaskNotice(line, &task, &node, &what)) {
      if (line.rfind("srun: error: ", 0) == 0) {
        r.last_error = line;
        while (!r.last_error.empty() &&
               (r.last_error.back() == '\n' || r.last_error.back() == '\r')) {
          r.last_error.pop_back();
        }
      }
      return;
    }
    if (stopping_) return;
    const std::string name = RankName(r.task, task);
    FlushBatch(b, stream);  // what came before it stays before it in the logs
    logs_.Write(name, line);
    const std::string prefix = "Exited with exit code ";
    const std::string how = what.rfind(prefix, 0) == 0
                                ? StrCat("exited with code ", what.substr(prefix.size()))
                                : StrCat("ended: ", what);
    r.failed_rank = task;
    Fail(StrCat(name, " (Slurm task ", task, " on ", node, ") under ", r.task.role, " (",
                r.task.host, ") ", how),
         1);
    reason_from_exit_ = true;
  }

  void Consume(Running& r, int stream, const char* data, size_t n) {
    std::string& buf = r.pending[stream];
    buf.append(data, n);
    Batch batch;
    size_t start = 0;
    for (;;) {
      const size_t nl = buf.find('\n', start);
      // A line longer than kMaxLine goes out in pieces of kMaxLine bytes, cut
      // where the bytes say, not where the pipe's reads happened to end.
      if ((nl == std::string::npos ? buf.size() : nl) - start > kMaxLine) {
        AddLine(r, stream, buf.substr(start, kMaxLine) + "\n", batch);
        start += kMaxLine;
        continue;
      }
      if (nl == std::string::npos) break;
      AddLine(r, stream, std::string_view(buf).substr(start, nl + 1 - start), batch);
      start = nl + 1;
    }
    buf.erase(0, start);
    FlushBatch(batch, stream);
  }

  void FlushPartial(Running& r, int stream) {
    if (r.pending[stream].empty()) return;
    Batch batch;
    AddLine(r, stream, r.pending[stream] + "\n", batch);
    FlushBatch(batch, stream);
    r.pending[stream].clear();
  }

  // One poll round over the output pipes (and the stop fd); at most timeout_ms.
  void PumpOutput(int timeout_ms, bool watch_stop) {
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owners;  // (running index, stream) per fd
    for (size_t i = 0; i < running_.size(); ++i) {
      Subprocess& p = *running_[i].proc;
      if (p.stdout_fd() >= 0) {
        fds.push_back({p.stdout_fd(), POLLIN, 0});
        owners.push_back({i, 0});
      }
      if (p.stderr_fd() >= 0) {
        fds.push_back({p.stderr_fd(), POLLIN, 0});
        owners.push_back({i, 1});
      }
    }
    bool stop_polled = watch_stop && options_.stop_fd >= 0;
    if (stop_polled) fds.push_back({options_.stop_fd, POLLIN, 0});
    if (fds.empty()) {
      usleep(static_cast<useconds_t>(timeout_ms) * 1000);
      return;
    }
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) return;
    char buf[65536];
    for (size_t k = 0; k < owners.size(); ++k) {
      if (fds[k].revents == 0) continue;
      Running& r = running_[owners[k].first];
      int stream = owners[k].second;
      ssize_t got = read(fds[k].fd, buf, sizeof(buf));
      if (got > 0) {
        Consume(r, stream, buf, static_cast<size_t>(got));
      } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
        FlushPartial(r, stream);
        if (stream == 0) {
          r.proc->CloseStdout();
        } else {
          r.proc->CloseStderr();
        }
      }
    }
    if (stop_polled && fds.back().revents != 0) {
      unsigned char sig = 0;
      if (read(options_.stop_fd, &sig, 1) == 1) {
        if (!stopping_) {
          Fail(sig != 0 ? "interrupted by " + SignalName(sig) : std::string("stop requested"),
               sig != 0 ? 128 + sig : 1);
        } else {
          // A second Ctrl-C while stopping: no more grace.
          Notice("pstrain launch: killing every process now\n");
          for (Running& other : running_) other.proc->SignalGroup(SIGKILL);
        }
      }
    }
  }

  // Reads what is already in `r`'s pipes, without waiting.
  void DrainNow(Running& r) {
    char buf[65536];
    for (int stream = 0; stream < 2; ++stream) {
      for (int rounds = 0; rounds < 64; ++rounds) {
        int fd = stream == 0 ? r.proc->stdout_fd() : r.proc->stderr_fd();
        if (fd < 0) break;
        ssize_t got = read(fd, buf, sizeof(buf));
        if (got > 0) {
          Consume(r, stream, buf, static_cast<size_t>(got));
          continue;
        }
        if (got == 0) {
          FlushPartial(r, stream);
          if (stream == 0) {
            r.proc->CloseStdout();
          } else {
            r.proc->CloseStderr();
          }
        }
        break;
      }
    }
  }

  // Whose fault a failure is (common/job_cause.h): the scheduler's verdict,
  // else the first a node gave (a node that found the scheduler silent); and
  // whether that process is stopped (SIGSTOP) right now, when it runs here.
  void NoteCause(const std::string& reporter, std::string_view text) {
    if (text.find(kJobCauseMarker) == std::string_view::npos) return;
    const bool from_scheduler = reporter.rfind("scheduler", 0) == 0;
    if (!cause_name_.empty() && (cause_from_scheduler_ || !from_scheduler)) return;
    std::string name, why;
    if (!ParseJobCause(std::string(text), &name, &why)) return;
    cause_name_ = name;
    cause_why_ = why;
    cause_reporter_ = reporter;
    cause_from_scheduler_ = from_scheduler;
    cause_where_.clear();
    for (const Running& r : running_) {
      if (r.task.tags != OutputTags::kNone || Name(r.task, r.task.rank) != name) continue;
      cause_where_ = StrCat(" on ", r.task.host, " (pid ", r.proc->pid());
      // (For a remote process this is its ssh client, which is not stopped.)
      char state = 0;
      int pgrp = 0;
      if (ReadProcStat(r.proc->pid(), &state, &pgrp) && state == 'T') cause_where_ += ", stopped";
      cause_where_ += ")";
    }
  }

  // The job's reason names the first process to exit; when the scheduler
  // blamed another one, the reason names that one first.
  void BlameCause() {
    if (!reason_from_exit_ || cause_name_.empty()) return;
    if (result_.reason.rfind(cause_name_ + " ", 0) == 0) return;
    result_.reason =
        StrCat(cause_name_, cause_where_, " caused it; ",
               cause_from_scheduler_ ? std::string("the scheduler") : cause_reporter_,
               " says: ", cause_why_, " (the first process to exit was ", result_.reason, ")");
  }

  void Fail(const std::string& reason, int exit_code) {
    if (stopping_) return;
    result_.success = false;
    result_.reason = reason;
    result_.exit_code = exit_code;
    Notice(StrCat("pstrain launch: ", reason, "; stopping the job\n"));
    StopAll();
  }

  // SIGTERM, and SIGCONT when a process of the group is stopped (SIGSTOP),
  // so that it acts on it. (Only then: srun reports every SIGCONT it gets.)
  static void Terminate(Running& r) {
    r.proc->SignalGroup(SIGTERM);
    if (GroupHasStoppedProcess(r.proc->pid())) r.proc->SignalGroup(SIGCONT);
    r.signalled = true;
  }

  void StopAll() {
    stopping_ = true;
    stop_started_ = SteadyClock::now();
    for (Running& r : running_) {
      if (r.proc->exited()) continue;
      if (r.task.stop_by_closing_stdin) {
        r.proc->CloseStdin();
      } else {
        Terminate(r);
      }
    }
  }

  // Escalation while stopping: SIGTERM after stdin_grace, SIGKILL after term_grace.
  void Escalate() {
    auto since =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - stop_started_)
            .count();
    for (Running& r : running_) {
      if (r.proc->exited()) continue;
      if (!r.signalled && since >= options_.stdin_grace_ms) {
        Terminate(r);
      }
      int kill_after =
          options_.term_grace_ms + (r.task.stop_by_closing_stdin ? options_.stdin_grace_ms : 0);
      if (since >= kill_after) r.proc->SignalGroup(SIGKILL);
    }
  }

  // Whether `r`, which has just exited abnormally, is started again rather
  // than failing the job. REQUIRES: !stopping_.
  bool MayRestart(const Running& r) const {
    return r.task.tags == OutputTags::kNone && !r.signalled && r.restarts < r.task.max_restarts &&
           !options_.deadline.Expired();
  }

  // "exited with code 3", "was killed by signal 9 (SIGKILL)". REQUIRES: exited.
  static std::string HowItEnded(const Subprocess& p) {
    const int status = p.wait_status();
    if (WIFSIGNALED(status)) {
      return StrCat("was killed by signal ", WTERMSIG(status), " (", SignalName(WTERMSIG(status)),
                    ")");
    }
    return p.ExitDescription();
  }

  // Starts running_[index]'s task again in place of its process, which has
  // exited abnormally (and been drained): says so on the terminal and in the
  // task's log, and counts the restart. Returns false, having failed the job,
  // when the new process cannot be started.
  bool Restart(size_t index) {
    Running& r = running_[index];
    const int n = r.restarts + 1;
    const std::string name = Name(r.task, r.task.rank);
    // What the old process (or what was left of its group) still writes
    // belongs before the restart line; its group was just killed, so its
    // pipes close at once unless something escaped the group.
    Deadline drained = Deadline::InMillis(500);
    while ((r.proc->stdout_fd() >= 0 || r.proc->stderr_fd() >= 0) && !drained.Expired()) {
      pollfd fds[2];
      nfds_t count = 0;
      for (int fd : {r.proc->stdout_fd(), r.proc->stderr_fd()}) {
        if (fd >= 0) fds[count++] = {fd, POLLIN, 0};
      }
      poll(fds, count, 50);
      DrainNow(r);
    }
    FlushPartial(r, 0);
    FlushPartial(r, 1);
    const std::string line = StrCat(
        "pstrain launch: ", name, " on ", r.task.host, " (pid ", r.proc->pid(), ") ",
        HowItEnded(*r.proc), "; restarting it (restart ", n, " of ", r.task.max_restarts, ")\n");
    Notice(line);
    logs_.Write(name, line);

    ProcessSpec spec = static_cast<size_t>(n) <= r.task.restart_specs.size()
                           ? r.task.restart_specs[static_cast<size_t>(n) - 1]
                           : r.task.spec;
    spec.env["PSTRAIN_RESTART"] = std::to_string(n);
    auto proc = Subprocess::Start(spec);
    r.restarts = n;
    if (!proc.ok()) {
      Fail(StrCat("cannot restart ", name, " on ", r.task.host, " (restart ", n, " of ",
                  r.task.max_restarts, "): ", proc.status().message()),
           1);
      reason_from_exit_ = true;
      return false;
    }
    r.proc = std::move(proc).value();
    r.pending[0].clear();
    r.pending[1].clear();
    r.signalled = false;
    result_.restarted_pids[index].push_back(r.proc->pid());
    ObserveStart(r);
    return true;
  }

  bool ReapAll() {
    bool all = true;
    for (size_t i = 0; i < running_.size(); ++i) {
      Running& r = running_[i];
      if (r.proc->exited()) continue;
      // While stopping, a process whose group still runs is not reaped: the
      // rest of the group keeps its grace (a non-exec'ing wrapper script
      // dies of the SIGTERM at once, its command saving a checkpoint does
      // not) until Escalate's SIGKILL.
      if (!r.proc->Poll(/*wait_for_group=*/stopping_)) {
        all = false;
        continue;
      }
      // What it wrote before exiting is in the pipes now (mpirun's notice
      // names the failed rank); read it before judging. (Poll killed what
      // the process left in its group.)
      DrainNow(r);
      ObserveExit(r);
      if (!r.proc->succeeded() && !stopping_ && MayRestart(r)) {
        if (Restart(i)) all = false;
        continue;
      }
      if (!r.proc->succeeded() && !stopping_ && r.task.may_be_lost && !r.signalled &&
          r.task.tags == OutputTags::kNone) {
        const std::string name = Name(r.task, r.task.rank);
        const std::string line =
            StrCat("pstrain launch: ", name, " on ", r.task.host, " (pid ", r.proc->pid(), ") ",
                   HowItEnded(*r.proc), "; the job goes on without it (--worker-loss continue)\n");
        Notice(line);
        logs_.Write(name, line);
        result_.lost.push_back(name);
        continue;
      }
      if (!r.proc->succeeded() && !stopping_) {
        std::string who = StrCat(Name(r.task, r.task.rank), " on ", r.task.host);
        std::string said;
        if (r.task.tags != OutputTags::kNone) {
          who = StrCat(r.task.role, " (", r.task.host, ")");
          if (r.failed_rank >= 0) {
            who = StrCat(RankName(r.task, r.failed_rank),
                         r.task.tags == OutputTags::kSlurm ? " (Slurm task " : " (MPI rank ",
                         r.failed_rank, ") under ", who);
          }
          if (!r.last_error.empty()) said = ": " + r.last_error;
        }
        std::string restarted;
        if (r.restarts > 0) {
          restarted =
              StrCat("; it had been restarted ", r.restarts, r.restarts == 1 ? " time" : " times");
          if (r.restarts >= r.task.max_restarts) restarted += ", as many as allowed";
        }
        if (r.restarts < r.task.max_restarts && r.task.tags == OutputTags::kNone &&
            options_.deadline.Expired()) {
          restarted += "; not restarted: the job ran past its --timeout";
        }
        Fail(StrCat(who, " (pid ", r.proc->pid(), ") ", r.proc->ExitDescription(), restarted, said),
             1);
        reason_from_exit_ = true;
      }
    }
    return all;
  }

  void WaitAllExited(Deadline deadline) {
    while (!deadline.Expired()) {
      bool all = true;
      for (Running& r : running_) all = r.proc->Poll(/*wait_for_group=*/true) && all;
      if (all) return;
      usleep(20000);
    }
  }

  void Loop() {
    result_.success = true;
    while (true) {
      // Once a process has closed its output only its exit is awaited: poll fast.
      bool output_open = false;
      for (Running& r : running_) {
        output_open = output_open || r.proc->stdout_fd() >= 0 || r.proc->stderr_fd() >= 0;
      }
      PumpOutput(output_open ? 100 : 5, true);
      if (options_.observer != nullptr) options_.observer->OnTick();
      bool all_exited = ReapAll();
      if (all_exited) break;
      if (!stopping_ && options_.deadline.Expired()) {
        Fail("the job ran past its --timeout", 1);
      }
      if (stopping_) {
        Escalate();
        auto since = std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() -
                                                                           stop_started_);
        if (since.count() > options_.stdin_grace_ms + options_.term_grace_ms + 3000) {
          Notice("pstrain launch: some processes did not exit after SIGKILL\n");
          break;
        }
      }
    }
    // Output written just before the exits, or by processes that escaped their
    // group (Poll kills what a process leaves in it).
    Deadline drain = Deadline::InMillis(kDrainMs);
    auto open_fds = [this] {
      for (Running& r : running_) {
        if (r.proc->stdout_fd() >= 0 || r.proc->stderr_fd() >= 0) return true;
      }
      return false;
    };
    while (open_fds() && !drain.Expired()) PumpOutput(50, false);
    for (Running& r : running_) {
      FlushPartial(r, 0);
      FlushPartial(r, 1);
    }
    if (result_.success) result_.exit_code = 0;
    if (!result_.success) BlameCause();
  }

  const SupervisorOptions& options_;
  LogSink logs_;
  std::vector<Running> running_;
  JobResult result_;
  bool stopping_ = false;
  SteadyClock::time_point stop_started_;
  bool reason_from_exit_ = false;  // the job failed because a process exited badly
  std::string cause_name_;         // whose fault: "server-0"
  std::string cause_why_;
  std::string cause_reporter_;  // who said so: "scheduler-0", "worker-1"
  bool cause_from_scheduler_ = false;
  std::string cause_where_;  // " on HOST (pid N[, stopped])"
};

}  // namespace

bool SplitRankTag(OutputTags tags, const std::string& line, int* rank, std::string* text) {
  if (tags == OutputTags::kSlurm) {
    // srun --label: the task number right-aligned to the widest one, ": ".
    size_t digits = line.find_first_not_of(' ');
    if (digits == std::string::npos) return false;
    size_t colon = line.find_first_not_of("0123456789", digits);
    if (colon == digits || colon == std::string::npos || colon - digits > 9 ||
        line.compare(colon, 2, ": ") != 0) {
      return false;
    }
    *rank = std::stoi(line.substr(digits, colon - digits));
    *text = line.substr(colon + 2);
    return true;
  }
  if (tags == OutputTags::kNone || line.empty() || line[0] != '[') return false;
  size_t close = line.find(']');
  if (close == std::string::npos) return false;
  std::string inside = line.substr(1, close - 1);
  size_t rest = close + 1;
  if (tags == OutputTags::kOpenMpi) {
    size_t comma = inside.find(',');
    if (comma == std::string::npos) return false;
    inside = inside.substr(comma + 1);
    size_t colon = line.find(">:", rest);
    if (colon == std::string::npos || line[rest] != '<') return false;
    rest = colon + 2;
  } else if (rest < line.size() && line[rest] == ' ') {
    ++rest;
  }
  if (inside.empty() || inside.size() > 9 ||
      !std::all_of(inside.begin(), inside.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  *rank = std::stoi(inside);
  *text = line.substr(rest);
  return true;
}

bool ParseSrunTaskNotice(const std::string& line, int* task, std::string* node, std::string* what) {
  // srun: error: NODE: task 1: Exited with exit code 3
  // srun: error: NODE: tasks 0,2-3: Killed
  static const std::string kPrefix = "srun: error: ";
  if (line.rfind(kPrefix, 0) != 0) return false;
  const size_t node_end = line.find(": task", kPrefix.size());
  if (node_end == std::string::npos) return false;
  size_t list = node_end + 6;
  if (list < line.size() && line[list] == 's') ++list;
  if (list >= line.size() || line[list] != ' ') return false;
  ++list;
  const size_t digits_end = line.find_first_not_of("0123456789", list);
  if (digits_end == list || digits_end == std::string::npos || digits_end - list > 9) return false;
  const size_t what_at = line.find(": ", digits_end);
  if (what_at == std::string::npos) return false;
  // Between the first number and ": " only more of the list: digits, ',' and '-'.
  if (line.find_first_not_of("0123456789,-", digits_end) != what_at) return false;
  *task = std::stoi(line.substr(list, digits_end - list));
  *node = line.substr(kPrefix.size(), node_end - kPrefix.size());
  *what = line.substr(what_at + 2);
  while (!what->empty() && (what->back() == '\n' || what->back() == '\r')) what->pop_back();
  return true;
}

StatusOr<JobResult> RunJob(std::vector<Task> tasks, const SupervisorOptions& options) {
  if (options.log_dir.empty()) return Status::InvalidArgument("no log directory given");
  RETURN_IF_ERROR(MakeDirs(options.log_dir));
  Job job(options);
  return job.Run(std::move(tasks));
}

}  // namespace pstrain::tracker
