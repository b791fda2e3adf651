// The live view of a job: one model of the state of a job's processes, built
// from what they log and from what the launcher records, and its rendering as
// one status line per process.
//
// Two sources feed the same model:
//  - `pstrain launch` (tools/launch_cmd.cc): every line a process writes, as
//    it arrives, and the supervisor's starts and exits as JobEvents;
//  - `pstrain top LOGDIR` (JobLogFollower below): the same lines read back
//    from <LOGDIR>/<role>-<rank>.log and the same events from
//    <LOGDIR>/launch.log, which the launcher writes (one FormatJobEvent line
//    per event).
// So a finished job's `top` shows what `launch` showed at its end.
//
// Per process: name ("worker-1"), host, state, epoch, batch of the epoch,
// samples/s (the last Speedometer line), the last metric, and the ETA of the
// epoch: (batches left) x (batch size) / (samples/s), from the trainer's
// "Epoch[N] Start: B batches of S samples; --num-epochs T" line (log_line.h);
// logs without it (MXNet's) have no ETA.
//
// Thread-compatible: one thread at a time.
#ifndef PSTRAIN_LOGTOOLS_JOB_VIEW_H_
#define PSTRAIN_LOGTOOLS_JOB_VIEW_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pstrain::logtools {

// What the launcher records about the job, one line each in launch.log:
//   <UTC time> job <id> pid=<launcher pid> host=<launcher host>
//   <UTC time> start <name> pid=<pid> host=<host>
//   <UTC time> exit <name> code=<c>                  (exited)
//   <UTC time> exit <name> signal=<s>[ stopped]      (killed; "stopped": by the launcher)
//   <UTC time> end ok|failed <the launcher's summary or reason>
// A process started again (server recovery) has a second start.
struct JobEvent {
  enum class Kind { kJob, kStart, kExit, kEnd };
  Kind kind = Kind::kStart;
  std::string name;      // kJob: the job id; kStart, kExit: "worker-1"
  std::string host;      // kJob, kStart (may hold spaces: it is last on the line)
  int pid = 0;           // kJob (the launcher), kStart
  int exit_code = 0;     // kExit when signal == 0
  int signal = 0;        // kExit: killed by this signal
  bool stopped = false;  // kExit: the launcher stopped it (the job was ending)
  bool ok = false;       // kEnd
  std::string text;      // kEnd
  std::string time;      // as read back ("2026-11-23T01:02:03.456Z"); set by FormatJobEvent
};

// One line, without a newline; `time` is written as given (FormatJobEvent
// fills an empty one with the current UTC time).
std::string FormatJobEvent(const JobEvent& event);
// False for a line that is not an event (a torn last line, a foreign file).
bool ParseJobEvent(std::string_view line, JobEvent* event);
inline constexpr char kJobEventsFile[] = "launch.log";

enum class ProcessState {
  kUnknown,   // seen in a log only (no launch.log): it may have ended
  kStarting,  // started, nothing written yet
  kRunning,   // has written output
  kDone,      // exited 0
  kFailed,    // exited non-zero or killed
  kStopped,   // killed by the launcher, which was stopping the job
};

struct ProcessView {
  std::string name;  // "worker-1"
  std::string host;  // "" if unknown
  ProcessState state = ProcessState::kUnknown;
  int exit_code = 0;  // kFailed, when signal == 0
  int signal = 0;     // kFailed, kStopped: the signal that ended it
  int starts = 0;     // start events seen (> 1: restarted)
  int epoch = -1;     // as logged (0-based); -1: no training line yet
  int num_epochs = 0;
  int64_t batches_done = 0;     // in `epoch`
  int64_t epoch_batches = 0;    // 0: unknown
  int64_t batch_size = 0;       // 0: unknown
  double samples_per_sec = -1;  // < 0: none yet
  std::string metric;           // "accuracy=0.953125", "train-accuracy=...", "val-accuracy=..."
  bool epoch_ended = false;     // `epoch` has its Time cost line
  int64_t lines = 0;            // lines seen
  // The failed job's end names it as the cause (the launcher's reason starts
  // with its name: the first to exit, or the one the scheduler blamed), which
  // its own state may not show: a worker whose script raised is often
  // stopped by the launcher while a server exits 1 first.
  bool cause = false;

  // (batches left) * batch_size / samples_per_sec while the epoch runs.
  std::optional<double> EpochEtaSeconds() const;
  // "running", "done", "failed(3)", "failed(SIGKILL)", "stopped", ...
  std::string StateText() const;
};

class JobView {
 public:
  void Apply(const JobEvent& event);
  // One line `name` wrote (without its newline).
  void AddLine(const std::string& name, std::string_view line);
  // The launcher ended without an end event (killed): the job is over.
  void MarkLauncherGone(const std::string& why);

  // Ordered by role (scheduler, server, worker, others by name), then rank.
  const std::vector<ProcessView>& processes() const { return processes_; }
  const ProcessView* Find(const std::string& name) const;
  const std::string& job_id() const { return job_id_; }
  int launcher_pid() const { return launcher_pid_; }
  const std::string& launcher_host() const { return launcher_host_; }
  bool ended() const { return ended_; }
  bool ended_ok() const { return ended_ok_; }
  const std::string& end_text() const { return end_text_; }

 private:
  ProcessView& Get(const std::string& name);

  std::vector<ProcessView> processes_;
  std::string job_id_;
  int launcher_pid_ = 0;
  std::string launcher_host_;
  bool ended_ = false;
  bool ended_ok_ = false;
  std::string end_text_;
};

// The status block: a header line, one line per process, a summary line
// ("5 processes: 3 running, 2 done; workers 3061.2 samples/s"), each cut to
// `width` columns (never wrapped). With max_lines > 0 the block has at most
// that many lines (the processes that do not fit are counted in one line).
// `title`, when not empty, is the first line.
std::vector<std::string> RenderJobView(const JobView& view, int width, int max_lines = 0,
                                       const std::string& title = "");

// Whether a line of a process's stderr is worth showing above the live block:
// glog errors (E/F), "error", "fatal", "failed", "Check failed", a Status
// (InvalidArgument: ..., Unavailable: ...), the scheduler's job-cause line.
bool IsImportantLine(std::string_view line);

// Follows a job directory written by `pstrain launch`: launch.log's events
// and the lines appended to every <role>-<rank>.log (and mpirun.log) since the
// last Poll.
class JobLogFollower {
 public:
  explicit JobLogFollower(std::string dir);
  // Feeds `view` with what is new: events first, then each process's lines.
  // NotFound if the directory does not exist.
  Status Poll(JobView* view);
  bool has_events() const { return has_events_; }

 private:
  struct File {
    int64_t offset = 0;
    std::string pending;  // a last line without its newline yet
  };
  // Reads what was appended to `path` since `f`, calling `line` per complete
  // line. A missing file is no error (false in *exists).
  Status ReadNew(const std::string& path, File* f, bool* exists,
                 const std::function<void(std::string_view)>& line);

  std::string dir_;
  std::map<std::string, File> files_;  // by file name
  bool has_events_ = false;
};

}  // namespace pstrain::logtools

#endif  // PSTRAIN_LOGTOOLS_JOB_VIEW_H_
