// pstrain launch: parses launch.py-style arguments itself (raw_args) and runs
// the job through tracker/launcher.h. SIGINT, SIGTERM and SIGHUP stop the job
// (and a wait for a Slurm allocation).
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "tools/commands.h"
#include "tracker/launcher.h"
#include "tracker/shell.h"
#include "tracker/slurm.h"

namespace pstrain {
namespace {

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
               "pstrain launch: job %s: 1 scheduler at %s:%d, %d servers, %d workers (%s%s); "
               "logs in %s\n",
               job_id.c_str(), plan->root_uri.c_str(), plan->root_port, options.num_servers,
               options.num_workers, tracker::LauncherName(plan->launcher), restarts.c_str(),
               log_dir.c_str());

  tracker::SupervisorOptions sup;
  sup.stop_fd = g_stop_pipe[0];
  auto result = tracker::ExecutePlan(std::move(plan).value(), options, sup);
  if (allocation != nullptr) {
    const std::string slurm_job = allocation->job().id;
    if (Status s = allocation->Release(); !s.ok()) {
      std::fprintf(stderr, "pstrain launch: job %s: %s; cancel it by hand: scancel %s\n",
                   job_id.c_str(), s.ToString().c_str(), slurm_job.c_str());
    }
  }
  if (!result.ok()) {
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
    if (!result->lost.empty()) {
      std::string lost;
      for (const std::string& name : result->lost) lost += (lost.empty() ? "" : ", ") + name;
      std::fprintf(stderr,
                   "pstrain launch: job %s finished: the %zu processes left exited 0%s; it went on "
                   "without %s\n",
                   job_id.c_str(), processes - result->lost.size(), after.c_str(), lost.c_str());
      return 0;
    }
    std::fprintf(stderr, "pstrain launch: job %s finished: all %zu processes exited 0%s\n",
                 job_id.c_str(), processes, after.c_str());
    return 0;
  }
  std::fprintf(stderr, "pstrain launch: job %s failed: %s (logs in %s)\n", job_id.c_str(),
               result->reason.c_str(), log_dir.c_str());
  return result->exit_code != 0 ? result->exit_code : 1;
}

}  // namespace pstrain
