// pstrain launch: parses launch.py-style arguments itself (raw_args) and runs
// the job through tracker/launcher.h. SIGINT, SIGTERM and SIGHUP stop the job
// (and a wait for a Slurm allocation).
// The job's starts and exits go to <log dir>/launch.log; on a terminal (or
// with --live) the live view (logtools/job_view.h) replaces the processes'
// prefixed output.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/fd_io.h"
#include "logtools/job_view.h"
#include "logtools/live_display.h"
#include "net/host_address.h"
#include "tools/commands.h"
#include "tracker/launcher.h"
#include "tracker/shell.h"
#include "tracker/slurm.h"

namespace pstrain {
namespace {

// Feeds the job's model from the supervisor, records its events in
// launch.log and, when live, keeps the view at the bottom of the terminal
// (stdout), with the processes' stdout lines, their errors and the launcher's
// notices printed above it.
class LaunchObserver : public tracker::JobObserver {
 public:
  LaunchObserver(const std::string& log_dir, bool live) : live_(live), display_(1) {
    std::error_code ec;
    std::filesystem::create_directories(log_dir, ec);
    const std::string path = log_dir + "/" + logtools::kJobEventsFile;
    events_fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (events_fd_ < 0) {
      std::fprintf(stderr, "pstrain launch: cannot write '%s': %s\n", path.c_str(),
                   strerror(errno));
    }
  }
  ~LaunchObserver() override {
    if (events_fd_ >= 0) close(events_fd_);
  }

  void Begin(const std::string& job_id) {
    logtools::JobEvent e;
    e.kind = logtools::JobEvent::Kind::kJob;
    e.name = job_id;
    e.pid = getpid();
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    e.host = host;
    Record(e);
  }

  // The job is over: records it and leaves the final view on the terminal.
  void End(bool ok, const std::string& text) {
    logtools::JobEvent e;
    e.kind = logtools::JobEvent::Kind::kEnd;
    e.ok = ok;
    e.text = text;
    Record(e);
    if (live_) {
      Redraw(true);
      display_.Release();
    }
  }

  void OnStart(const std::string& name, const std::string& host, int pid) override {
    logtools::JobEvent e;
    e.kind = logtools::JobEvent::Kind::kStart;
    e.name = name;
    e.host = host;
    e.pid = pid;
    Record(e);
    Redraw(false);
  }

  void OnLine(const std::string& name, int stream, std::string_view line) override {
    view_.AddLine(name, line);
    if (!live_) return;
    if (stream == 0 || logtools::IsImportantLine(line)) {
      display_.PrintAbove(stream == 0 ? 1 : 2, StrCat("[", name, "] ", line, "\n"));
    }
    Redraw(false);
  }

  void OnExit(const std::string& name, int wait_status, bool stopped) override {
    logtools::JobEvent e;
    e.kind = logtools::JobEvent::Kind::kExit;
    e.name = name;
    if (WIFSIGNALED(wait_status)) {
      e.signal = WTERMSIG(wait_status);
      e.stopped = stopped;
    } else {
      e.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
    }
    Record(e);
    Redraw(true);
  }

  bool OnNotice(const std::string& text) override {
    if (!live_) return false;
    display_.PrintAbove(2, text);
    Redraw(true);
    return true;
  }

  void OnTick() override { Redraw(false); }

 private:
  void Record(const logtools::JobEvent& e) {
    view_.Apply(e);
    if (events_fd_ >= 0) WriteAll(events_fd_, logtools::FormatJobEvent(e) + "\n");
  }

  void Redraw(bool force) {
    if (!live_) return;
    int columns = 0, rows = 0;
    display_.Size(&columns, &rows);
    // The last column and row stay free: no wrap, no scroll.
    display_.Draw(logtools::RenderJobView(view_, columns - 1, rows - 1), force);
  }

  bool live_;
  logtools::LiveDisplay display_;
  logtools::JobView view_;
  int events_fd_ = -1;
};

int g_stop_pipe[2] = {-1, -1};  // the signal handler writes the signal number here

void OnStopSignal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (write(g_stop_pipe[1], &b, 1) < 0) {
    // The pipe is full: a stop is already pending.
  }
  errno = saved;
}

}  // namespace

int RunLaunch(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto parsed = tracker::ParseLaunchArgs(args);
  if (!parsed.ok()) {
    std::fprintf(stderr, "pstrain launch: %s\n\n%s", parsed.status().message().c_str(),
                 tracker::LaunchUsage().c_str());
    return 2;
  }
  tracker::LaunchOptions options = std::move(parsed).value();
  if (options.help) {
    std::fputs(tracker::LaunchUsage().c_str(), stdout);
    return 0;
  }
  if (pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("pstrain launch: pipe");
    return 1;
  }
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // --launcher slurm outside an allocation: ask for one first; it is
  // released when this function returns.
  Environment env;
  std::unique_ptr<tracker::SlurmAllocation> allocation;
  if (options.launcher == tracker::LauncherKind::kSlurm &&
      tracker::SlurmJobFromEnvironment(env).status().code() == StatusCode::kNotFound) {
    if (options.job_id.empty()) options.job_id = tracker::NewJobId();
    std::fprintf(
        stderr, "pstrain launch: job %s: asking Slurm for an allocation: %s\n",
        options.job_id.c_str(),
        tracker::ShellJoinReadable(tracker::SallocCommand(options, options.job_id)).c_str());
    int stop_signal = 0;
    auto granted = tracker::SlurmAllocation::Request(
        options, options.job_id, env.All(), g_stop_pipe[0], &stop_signal, options.quiet ? -1 : 2);
    if (!granted.ok()) {
      std::fprintf(stderr, "pstrain launch: job %s: %s\n", options.job_id.c_str(),
                   granted.status().ToString().c_str());
      return stop_signal != 0 ? 128 + stop_signal : 1;
    }
    allocation = std::move(granted).value();
    std::fprintf(stderr, "pstrain launch: job %s: Slurm allocation %s: %d node(s) %s\n",
                 options.job_id.c_str(), allocation->job().id.c_str(), allocation->job().num_nodes,
                 allocation->job().nodelist.c_str());
    env = Environment(allocation->Variables());
  } else if (options.launcher == tracker::LauncherKind::kSlurm &&
             (options.nodes > 0 || !options.partition.empty() || !options.time_limit.empty() ||
              !options.salloc_options.empty())) {
    std::fprintf(stderr,
                 "pstrain launch: inside Slurm allocation %s: --nodes, --partition, --time and "
                 "--salloc-option ask for a new allocation and are ignored\n",
                 env.Get("SLURM_JOB_ID").value_or(env.Get("SLURM_JOBID").value_or("?")).c_str());
  }

  auto plan = tracker::PlanLaunch(options, env);
  if (!plan.ok()) {
    std::fprintf(stderr, "pstrain launch: %s\n", plan.status().ToString().c_str());
    return 1;
  }
  std::string job_id = plan->job_id, log_dir = plan->log_dir;
  // A task for a group (mpirun, a srun step) stands for one process per rank.
  size_t processes = 0;
  for (const tracker::Task& t : plan->tasks) {
    processes += t.rank_names.empty() ? 1 : t.rank_names.size();
  }
  std::string restarts = options.restart_servers > 0 ? StrCat(", each server restarted up to ",
                                                              options.restart_servers, " times")
                                                     : std::string();
  if (plan->launcher == tracker::LauncherKind::kSlurm) {
    restarts += StrCat(", Slurm job ", plan->slurm_job_id);
  }
  std::fprintf(stderr,
               "pstrain launch: job %s: 1 scheduler at %s, %d servers, %d workers (%s%s); "
               "logs in %s\n",
               job_id.c_str(), JoinHostPort(plan->root_uri, plan->root_port).c_str(),
               options.num_servers, options.num_workers, tracker::LauncherName(plan->launcher),
               restarts.c_str(), log_dir.c_str());

  const bool live =
      options.live.value_or(!options.quiet && logtools::LiveDisplay::IsTerminal(1, Environment()));
  LaunchObserver observer(log_dir, live);
  observer.Begin(job_id);
  tracker::SupervisorOptions sup;
  sup.stop_fd = g_stop_pipe[0];
  sup.observer = &observer;
  sup.echo = !live;
  auto result = tracker::ExecutePlan(std::move(plan).value(), options, sup);
  if (allocation != nullptr) {
    const std::string slurm_job = allocation->job().id;
    if (Status s = allocation->Release(); !s.ok()) {
      std::fprintf(stderr, "pstrain launch: job %s: %s; cancel it by hand: scancel %s\n",
                   job_id.c_str(), s.ToString().c_str(), slurm_job.c_str());
    }
  }
  if (!result.ok()) {
    observer.End(false, result.status().ToString());
    std::fprintf(stderr, "pstrain launch: job %s: %s\n", job_id.c_str(),
                 result.status().ToString().c_str());
    return 1;
  }
  if (result->success) {
    size_t restarted = 0;
    for (const std::vector<int>& pids : result->restarted_pids) restarted += pids.size();
    const std::string after =
        restarted > 0 ? StrCat(" (after ", restarted, restarted == 1 ? " restart)" : " restarts)")
                      : std::string();
    std::string summary = StrCat("all ", processes, " processes exited 0", after);
    if (!result->lost.empty()) {
      std::string lost;
      for (const std::string& name : result->lost) lost += (lost.empty() ? "" : ", ") + name;
      summary = StrCat("the ", processes - result->lost.size(), " processes left exited 0", after,
                       "; it went on without ", lost);
    }
    observer.End(true, summary);
    std::fprintf(stderr, "pstrain launch: job %s finished: %s\n", job_id.c_str(), summary.c_str());
    return 0;
  }
  observer.End(false, result->reason);
  std::fprintf(stderr, "pstrain launch: job %s failed: %s (logs in %s)\n", job_id.c_str(),
               result->reason.c_str(), log_dir.c_str());
  return result->exit_code != 0 ? result->exit_code : 1;
}

}  // namespace pstrain
