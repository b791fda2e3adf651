// pstrain launch: starts a parameter-server job (1 scheduler, S servers,
// W workers) with MXNet's tracker semantics (../shared/reference/mxnet_facts.md
// section 2) on this host, over ssh from a host file, under mpirun, or as
// Slurm job steps (srun; tracker/slurm.h).
//
// Every process gets MXNet's environment: DMLC_ROLE, DMLC_PS_ROOT_URI,
// DMLC_PS_ROOT_PORT, DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_NODE_HOST (local
// and ssh), DMLC_TASK_ID and DMLC_JOB_CLUSTER as dmlc-core's tracker sets them,
// plus PSTRAIN_LAUNCH_RANK (rank within the role), PSTRAIN_JOB_ID and
// PSTRAIN_SERVER_RESTARTS, plus the variables given with --env. The scheduler
// always runs on the launching host.
//
// Server recovery (--restart-servers K, local and ssh): every server task may
// be restarted K times (Task::max_restarts); every process gets
// PSTRAIN_SERVER_RESTARTS=K and, unless the user set it, PSTRAIN_SNAPSHOT_DIR=
// <absolute log dir>/snapshots; a restarted server gets PSTRAIN_RESTART=n.
#ifndef PSTRAIN_TRACKER_LAUNCHER_H_
#define PSTRAIN_TRACKER_LAUNCHER_H_

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "net/job_keys.h"
#include "tracker/hostfile.h"
#include "tracker/supervisor.h"

namespace pstrain::tracker {

enum class LauncherKind { kLocal, kSsh, kMpi, kSlurm };
const char* LauncherName(LauncherKind kind);

struct LaunchOptions {
  int num_workers = 0;                   // -n: required, >= 1
  int num_servers = -1;                  // -s: default = num_workers
  std::optional<LauncherKind> launcher;  // default: ssh with -H, else local
  std::string hostfile;                  // -H
  std::string sync_dst_dir;              // ssh: rsync the working directory here first
  std::string log_dir;                   // default logs/<job-id>
  std::string job_id;                    // default <UTC time>-<pid>
  std::string host_ip;                   // scheduler address; default auto-detected
  // --env K=V, --env K:V (MXNet's form) or --env K (value from the launcher's environment).
  std::vector<std::pair<std::string, std::optional<std::string>>> env;
  std::vector<std::string> ssh_options;  // each passed to ssh as -o OPT (before our defaults)
  bool no_host_key_check = false;        // ssh -o StrictHostKeyChecking=no
  std::vector<std::string> mpi_options;  // extra mpirun arguments
  std::string mpirun = "mpirun";
  // Slurm (--launcher slurm). Inside an allocation (SLURM_JOB_ID set) the
  // servers and workers run as two srun steps of it; outside one, `pstrain
  // launch` first asks for one with salloc (tracker/slurm.h).
  std::vector<std::string> srun_options;    // extra arguments for each srun step
  std::vector<std::string> salloc_options;  // extra arguments for the salloc request
  std::string partition;                    // salloc --partition
  std::string time_limit;                   // salloc --time
  int nodes = 0;                            // salloc --nodes; 0: max(S, W)
  int alloc_timeout_s = 600;                // how long to wait for the allocation
  std::string ssh = "ssh";
  std::string rsync = "rsync";
  int timeout_s = 0;  // stop the job after this long; 0: no limit
  // --restart-servers K: a server process that exits non-zero or is killed is
  // started again with the same rank, up to K times per server (>= 0; local
  // and ssh only: mpirun and srun own their processes).
  int restart_servers = 0;
  // --worker-loss continue: a dead worker does not end the job (the others
  // go on, rescaled; PSTRAIN_WORKER_LOSS). Local and ssh launchers.
  bool continue_without_lost_workers = false;
  int sync_timeout_s = 600;
  bool quiet = false;  // do not copy the processes' output to the terminal
  // --live / --no-live: the live view (one status line per process, redrawn
  // in place) instead of the processes' output. Default: when stdout is a
  // terminal (and TERM is not dumb) and not --quiet.
  std::optional<bool> live;
  // The job's CURVE keys (PSTRAIN_KEY_FILE for every process): --key-file, else
  // the launcher's PSTRAIN_KEY_FILE, else new keys in <log-dir>/job.key.
  // --no-keys runs the job without (anyone who reaches its ports can join).
  std::string key_file;
  bool no_keys = false;
  bool help = false;
  std::vector<std::string> command;  // the job: run by every process
};

// Parses launch.py-style arguments (args[0] is the first argument, not the
// program name). Options come first; the command starts at the first word that
// is not an option, or after "--"; everything after it belongs to the command.
StatusOr<LaunchOptions> ParseLaunchArgs(const std::vector<std::string>& args);
// The --help text.
std::string LaunchUsage();

// The process plan of a job, before anything runs (tests inspect it).
struct LaunchPlan {
  LauncherKind launcher = LauncherKind::kLocal;
  std::string job_id;
  std::string log_dir;
  std::string root_uri;
  int root_port = 0;
  std::vector<Host> hosts;  // ssh: the host file; mpi: empty
  std::vector<Task> tasks;  // scheduler first, then servers, then workers (or groups)
  std::vector<std::vector<std::string>> sync_commands;  // rsync per host, run before the tasks
  // The job's keys: their file (absolute; empty with --no-keys), whether the
  // launcher makes it (new keys), and its text (written to it, and given to
  // each ssh session on stdin: never on a command line).
  std::string key_file;
  bool write_key = false;
  JobKeys keys;
  std::string key_text;
  // slurm: the allocation's job id and the names of the srun steps the job
  // starts (ExecutePlan cancels any of them still there at the end).
  std::string slurm_job_id;
  std::vector<std::string> slurm_steps;
};

// Builds the plan: reads the host file, picks the scheduler address and a free
// port, detects the MPI flavour, quotes the remote commands. `env` is the
// launcher's environment (copied to local processes and mpirun less PORT,
// forwarded in part to ssh hosts).
// slurm: `env` must name the allocation (SLURM_JOB_ID; SlurmAllocation
// gives these variables for one the launcher asked for); without --host-ip,
// the scheduler address comes from the allocated nodes' addresses (sinfo).
StatusOr<LaunchPlan> PlanLaunch(const LaunchOptions& options, const Environment& env);

// A new job id: the UTC time and the launcher's pid, "20260101-120000-4242".
std::string NewJobId();

// Runs the rsync commands, then the job. See RunJob for the result. slurm:
// afterwards cancels the job's steps that are still known to Slurm (a srun
// that was killed leaves its step behind for a while).
StatusOr<JobResult> ExecutePlan(LaunchPlan plan, const LaunchOptions& options,
                                const SupervisorOptions& supervisor);

// `dir` as a word for the remote shell: quoted, a leading "~/" left for it
// to expand to the remote home.
std::string RemoteShellPath(const std::string& dir);

// The remote command the ssh launcher runs: a constant /bin/sh script that
// starts `command` with `vars` in `dir` (a leading "~/": in the remote home)
// as its own process group, and kills
// that group when its stdin (the ssh session) closes. Every word is quoted.
// It first reads the job's key file from stdin, up to a line
// kRemoteKeysEnd, into a private temporary file that it names in
// PSTRAIN_KEY_FILE (nothing before the marker: no keys) and removes at the end.
std::string RemoteCommand(const std::string& dir, const std::map<std::string, std::string>& vars,
                          const std::vector<std::string>& command);
inline constexpr char kRemoteKeysEnd[] = "pstrain-keys-end";

// An address of this host for the scheduler: 127.0.0.1 when every host is a
// loopback name (or there are none); else the address the host name resolves
// to, or the one routing picks towards the outside (dmlc-core's rule).
StatusOr<std::string> DetectHostIp(const std::vector<Host>& hosts);
// A TCP port free on `ip` right now: `wanted` if it is (Unavailable if not),
// or with `wanted` 0 one of 9091..9998.
StatusOr<int> FindFreePort(const std::string& ip, int wanted = 0);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_LAUNCHER_H_
