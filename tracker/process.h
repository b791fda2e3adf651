// Subprocess: one child process started with an explicit argv and environment
// (never through a shell), in its own process group, with its stdout and
// stderr on pipes the caller reads.
//
// Thread safety: a Subprocess is used by one thread at a time.
#ifndef PSTRAIN_TRACKER_PROCESS_H_
#define PSTRAIN_TRACKER_PROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain::tracker {

struct ProcessSpec {
  std::vector<std::string> argv;           // argv[0] is looked up in PATH
  std::map<std::string, std::string> env;  // the child's complete environment
  std::string cwd;                         // empty: the caller's working directory
  // True: the caller holds a pipe to the child's stdin (CloseStdin() sends EOF).
  // False: stdin is /dev/null.
  bool pipe_stdin = false;
  // With pipe_stdin: written to the child's stdin once it runs (a few KB at
  // most: it must fit the pipe). Secrets go here, never in argv.
  std::string stdin_data;
};

class Subprocess {
 public:
  // Forks and execs `spec`. The child leads a new process group (so the whole
  // tree it starts can be signalled) and gets SIGTERM if the caller dies.
  // Returns NotFound/IOError naming argv[0] when it cannot be executed.
  // A caller that ignores SIGCHLD (so that no exit status could be read) has
  // it set back to the default.
  static StatusOr<std::unique_ptr<Subprocess>> Start(const ProcessSpec& spec);

  // Kills the process group with SIGKILL and reaps the child if it still runs.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // Read ends of the child's stdout/stderr (non-blocking); -1 once closed.
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  void CloseStdout();
  void CloseStderr();
  // Sends EOF to the child's stdin (no-op without pipe_stdin).
  void CloseStdin();
  // Writes `data` to the child's stdin (blocking); false without pipe_stdin or
  // when the child no longer reads it (no SIGPIPE is raised).
  bool WriteStdin(const std::string& data);

  // Reaps the child without blocking; true once it has exited. What the child
  // left running in its process group is killed (SIGKILL) before it is
  // reaped: a job's process takes the helpers it started with it. With
  // `wait_for_group` (while a job is stopping, its processes given time to
  // end) an exited child whose group still runs is left unreaped, so that the
  // group can still be signalled: false until the rest has ended.
  bool Poll(bool wait_for_group = false);
  bool exited() const { return exited_; }
  // The raw waitpid status. REQUIRES: exited().
  int wait_status() const { return wait_status_; }
  // True when it exited with code 0. REQUIRES: exited().
  bool succeeded() const;
  // "exited with code 3", "killed by signal 9 (Killed)". REQUIRES: exited().
  std::string ExitDescription() const;

  // Sends `sig` to the child's process group (no-op once reaped).
  void SignalGroup(int sig);

 private:
  Subprocess() = default;

  pid_t pid_ = -1;
  int in_fd_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool exited_ = false;
  int wait_status_ = 0;
};

// Runs `argv` to completion (stdin /dev/null), collecting stdout and stderr
// together into *output. Kills it and returns DeadlineExceeded past `timeout_ms`.
// The exit status is in *wait_status. With a `stop_fd` (a launcher's stop
// pipe, as SupervisorOptions::stop_fd): once it is readable, one byte (the
// signal that asked, 0 if none) is read into *stop_signal, the process group
// is killed and Cancelled returned.
Status RunAndCapture(const std::vector<std::string>& argv,
                     const std::map<std::string, std::string>& env, int timeout_ms,
                     std::string* output, int* wait_status, int stop_fd = -1,
                     int* stop_signal = nullptr);

// What one command of RunAllAndCapture did.
struct CapturedRun {
  // Ok when it ran to its end (whatever its exit code); NotFound/IOError when it
  // could not start; DeadlineExceeded when it was killed past the timeout.
  Status status;
  std::string output;   // its stdout and stderr together
  int wait_status = 0;  // the raw waitpid status, when `status` is ok
};

// Runs every command of `argvs` (stdin /dev/null), at most `max_parallel` at
// once, each killed past `timeout_ms` from its own start; one result per
// command in *results, in order. A command that fails, cannot start or times
// out does not stop the others. With a `stop_fd` (as RunAndCapture): once it
// is readable, every running command is killed and Cancelled returned.
Status RunAllAndCapture(const std::vector<std::vector<std::string>>& argvs,
                        const std::map<std::string, std::string>& env, int timeout_ms,
                        int max_parallel, std::vector<CapturedRun>* results, int stop_fd = -1,
                        int* stop_signal = nullptr);

// "SIGINT" for 2; "signal 99" for a number without a name.
std::string SignalName(int sig);

// A process's state ('R', 'S', 'T', 'Z', ...) and process group, from
// /proc/PID/stat; false when it is gone.
bool ReadProcStat(int pid, char* state, int* pgrp);
// Whether a process of process group `pgid` is stopped (SIGSTOP, SIGTSTP);
// true when /proc cannot be read.
bool GroupHasStoppedProcess(int pgid);
// Whether a process of group `pgid` other than `except` runs (a zombie does
// not count); true when /proc cannot be read.
bool GroupHasLiveProcess(int pgid, int except);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_PROCESS_H_
