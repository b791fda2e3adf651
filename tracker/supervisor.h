// Supervisor: runs the processes of one job, forwards their output, and stops
// the whole job when one of them fails or when the launcher is told to stop.
//
// Output: every line a process writes goes to the launcher's terminal
// (stdout lines to stdout, stderr lines to stderr) prefixed "[<role>-<rank>] ",
// and unprefixed to <log_dir>/<role>-<rank>.log. A task that stands for a
// group of processes (one mpirun) has its lines split by the MPI rank tag that
// mpirun adds (Open MPI --tag-output, MPICH -prepend-rank) or srun adds
// (--label).
//
// Policy: the job succeeds when every process exits with code 0 (for a task
// that was restarted: its last process). The first process that exits
// non-zero or is killed fails the job: all others are stopped (stdin closed
// first for tasks that ask for it, then SIGTERM to each process group, then
// SIGKILL after a grace period) and the result names it. A task with restarts
// left (Task::max_restarts) does not fail the job: its process is started
// again, a line on the launcher's stderr and in its log saying so. Nothing is
// restarted once the job is stopping (a failure, a stop request, the deadline),
// and no process the supervisor signalled is restarted. A group task's
// process is named by its rank tag where the group says which one failed
// (mpirun's notice, the MPICH wrapper's marker, srun's task notice); the
// marker and srun's notice fail the job as soon as they are read.
//
// Thread safety: RunJob runs on the calling thread; nothing is shared.
#ifndef PSTRAIN_TRACKER_SUPERVISOR_H_
#define PSTRAIN_TRACKER_SUPERVISOR_H_

#include <string>
#include <string_view>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "tracker/process.h"

namespace pstrain::tracker {

// How the lines of a task's output name the process that wrote them.
enum class OutputTags {
  kNone,     // one process: every line is <role>-<rank>
  kOpenMpi,  // "[<jobid>,<rank>]<stdout>:" prefix (mpirun --tag-output)
  kMpich,    // "[<rank>] " prefix (mpirun -prepend-rank)
  kSlurm,    // "<rank>: " prefix, right-aligned with spaces (srun --label)
};

struct Task {
  std::string role;  // "scheduler", "server", "worker"; "mpirun" for an MPI group
  int rank = 0;      // rank within the role; ignored when tags != kNone
  std::string host;  // where it runs, for messages
  ProcessSpec spec;
  OutputTags tags = OutputTags::kNone;
  // With tags: the name of the process behind each rank tag ("server-0", ...);
  // a rank outside the list is "<role>-<rank>". Untagged lines (mpirun's own)
  // go to "<role>".
  std::vector<std::string> rank_names;
  // Stop by closing stdin first (the ssh wrapper kills the remote process group
  // on EOF), and signal only if that has not ended it within stdin_grace_ms.
  bool stop_by_closing_stdin = false;
  // How many times the process may be started again after it exits non-zero
  // or is killed by a signal (server recovery: pstrain launch
  // --restart-servers). Restart n (1, 2, ...) runs `spec`, or
  // restart_specs[n-1] when there is one, with PSTRAIN_RESTART=n added to its
  // environment; its output goes on to the same log file and prefix. A
  // restart that fails again counts too: once max_restarts are used up, the
  // next abnormal exit fails the job. 0: the first abnormal exit fails the job.
  // Ignored for tasks with tags (mpirun owns its ranks).
  int max_restarts = 0;
  // Optional: the spec of restart n is restart_specs[n-1], for commands that
  // must carry PSTRAIN_RESTART themselves (the ssh launcher's remote command:
  // the ssh client's environment does not reach the remote process).
  std::vector<ProcessSpec> restart_specs;
  // A worker the job may go on without (--worker-loss continue): when its
  // process exits abnormally the supervisor says so and lets the job run; the
  // job succeeds if every other process exits 0.
  bool may_be_lost = false;
};

// Told what happens in a job as it happens (the live view of `pstrain launch`
// and its record in launch.log). Called on RunJob's thread only.
class JobObserver {
 public:
  virtual ~JobObserver() = default;
  // A process started: "worker-1" (for a task with tags: each of its rank
  // names and its role, "mpirun", as the task starts). Again after a restart.
  virtual void OnStart(const std::string& name, const std::string& host, int pid) = 0;
  // One line of its output (stream 0 stdout, 1 stderr), without the newline.
  virtual void OnLine(const std::string& name, int stream, std::string_view line) = 0;
  // It exited (waitpid status); `stopped`: the supervisor had signalled it.
  virtual void OnExit(const std::string& name, int wait_status, bool stopped) = 0;
  // A line of the launcher's own ("pstrain launch: ... stopping the job\n")
  // for the terminal's stderr. Returns true when it showed it; false: the
  // supervisor writes it to terminal_err_fd.
  virtual bool OnNotice(const std::string& text) = 0;
  // At least every 100 ms while the job runs.
  virtual void OnTick() = 0;
};

struct SupervisorOptions {
  std::string log_dir;  // created if missing; must be set
  bool echo = true;     // copy prefixed lines to the terminal
  int terminal_out_fd = 1;
  int terminal_err_fd = 2;
  // Readable means: stop the job. One byte is read: the signal number that
  // asked for it (0 if none). A second byte while stopping: SIGKILL everything
  // at once. -1: no stop requests.
  int stop_fd = -1;
  int stdin_grace_ms = 5000;              // after closing stdin, before SIGTERM
  int term_grace_ms = 5000;               // after SIGTERM, before SIGKILL
  Deadline deadline = Deadline::Never();  // the whole job (then it is stopped)
  JobObserver* observer = nullptr;        // not owned; may be null
};

struct JobResult {
  bool success = false;
  int exit_code = 0;   // what the launcher should exit with: 0, 1, or 128+signal
  std::string reason;  // empty on success; else what failed, e.g. "worker-1 ... exited with code 3"
  // The first process of each task, in task order (for tests and logs).
  std::vector<int> pids;
  // Per task, in task order (same size as pids): the pids of its restarts, in
  // the order they were started; empty for a task that was never restarted.
  std::vector<std::vector<int>> restarted_pids;
  // Tasks whose process died and that the job went on without (may_be_lost),
  // as "worker-1".
  std::vector<std::string> lost;
};

// Starts `tasks` in order and supervises them to the end. Returns an error
// only when the job could not be set up (log directory, a command that cannot
// be executed); the processes already started are stopped first.
StatusOr<JobResult> RunJob(std::vector<Task> tasks, const SupervisorOptions& options);

// "[1,3]<stdout>:text" -> rank 3, text "text" (Open MPI); "[3] text" -> 3 (MPICH);
// " 3: text" -> 3 (srun --label). Returns false when `line` carries no tag of that kind.
bool SplitRankTag(OutputTags tags, const std::string& line, int* rank, std::string* text);

// What the mpi launcher's rank wrapper writes on stderr, followed by the exit
// code, when its command fails (MPICH does not stop the job by itself).
inline constexpr char kMpiRankFailedMarker[] = "pstrain launch: MPI rank exited with code ";

// srun's notice about failed tasks, "srun: error: NODE: task 1: Exited with
// exit code 3" or "srun: error: NODE: tasks 0,2-3: Killed": true, with the
// first task listed, the node and what happened ("Exited with exit code 3").
// A task group under srun fails the job on the first such notice.
bool ParseSrunTaskNotice(const std::string& line, int* task, std::string* node, std::string* what);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_SUPERVISOR_H_
