#include "tracker/slurm.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>

#include "common/deadline.h"
#include "tracker/process.h"
#include "tracker/shell.h"

namespace pstrain::tracker {
namespace {

constexpr int kQueryTimeoutMs = 30000;  // one sinfo/squeue/scancel call

// Runs a Slurm client command; its output, or an error naming the command
// with what it said.
StatusOr<std::string> RunSlurmCommand(const std::vector<std::string>& argv,
                                      const std::map<std::string, std::string>& env) {
  std::string out;
  int status = 0;
  Status s = RunAndCapture(argv, env, kQueryTimeoutMs, &out, &status);
  if (!s.ok()) return s.WithContext(ShellJoinReadable(argv));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const std::string how = WIFEXITED(status) ? StrCat("exited with code ", WEXITSTATUS(status))
                                              : StrCat("ended with wait status ", status);
    return Status::Unavailable(StrCat(ShellJoinReadable(argv), " ", how, ": ", out));
  }
  return out;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// A positive count from the environment variable `name`.
StatusOr<int> NodeCount(const std::string& name, const std::string& value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || v < 1 || v > 1000000) {
    return Status::InvalidArgument(
        StrCat(name, "='", value, "' is not a node count (an integer >= 1)"));
  }
  return static_cast<int>(v);
}

}  // namespace

StatusOr<SlurmJob> SlurmJobFromEnvironment(const Environment& env) {
  SlurmJob job;
  std::optional<std::string> id = env.Get("SLURM_JOB_ID");
  if (!id) id = env.Get("SLURM_JOBID");
  if (!id) {
    return Status::NotFound(
        "not inside a Slurm allocation (SLURM_JOB_ID is not set): run `pstrain launch "
        "--launcher slurm` as it is to have it ask for one, or under salloc or sbatch");
  }
  if (id->find_first_not_of("0123456789_+") != std::string::npos) {
    return Status::InvalidArgument(StrCat("SLURM_JOB_ID='", *id, "' is not a Slurm job id"));
  }
  job.id = *id;
  std::optional<std::string> nodes = env.Get("SLURM_JOB_NODELIST");
  if (!nodes) nodes = env.Get("SLURM_NODELIST");
  job.nodelist = nodes.value_or("");
  for (const char* name : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES"}) {
    if (std::optional<std::string> count = env.Get(name)) {
      ASSIGN_OR_RETURN(job.num_nodes, NodeCount(name, *count));
      break;
    }
  }
  return job;
}

StatusOr<std::vector<Host>> SlurmNodeAddresses(const std::string& nodelist,
                                               const std::map<std::string, std::string>& env) {
  if (nodelist.empty()) {
    return Status::NotFound(
        "the allocation's nodes are unknown (SLURM_JOB_NODELIST is not set); pass --host-ip");
  }
  // One line per node: "NAME ADDRESS".
  ASSIGN_OR_RETURN(std::string out, RunSlurmCommand({"sinfo", "--noheader", "--Node",
                                                     "--nodes=" + nodelist, "--format=%N %o"},
                                                    env));
  std::vector<Host> hosts;
  std::set<std::string> seen;  // a node in several partitions is listed once each
  for (const std::string& line : Lines(out)) {
    std::istringstream words(line);
    std::string name, address;
    words >> name >> address;
    if (address.empty()) address = name;
    if (!seen.insert(name).second) continue;
    Host h;
    h.name = address;
    hosts.push_back(h);
  }
  if (hosts.empty()) {
    return Status::NotFound(
        StrCat("sinfo lists none of the allocation's nodes '", nodelist, "'; pass --host-ip"));
  }
  return hosts;
}

std::string SlurmStepName(const std::string& job_id, const std::string& role) {
  return StrCat("pstrain-", job_id, "-", role, "s");
}

std::vector<std::string> SrunCommand(const LaunchOptions& o, const SlurmJob& job,
                                     const std::string& step_name, int count, int task_id_offset,
                                     const std::vector<std::string>& command) {
  // The task's rank is SLURM_PROCID; the step's first task id comes as $1.
  // A worker's rank among the workers of its node is its SLURM_LOCALID (the
  // workers' step holds workers only), and their count is its node's entry
  // (SLURM_NODEID, the node's index in the step) in SLURM_STEP_TASKS_PER_NODE
  // ("2(x3),1": 2 on each of the first three nodes, then 1).
  static const std::string kRankScript =
      "r=${SLURM_PROCID:-}; o=$1; shift; "
      "[ -n \"$r\" ] || { echo 'pstrain launch: no SLURM_PROCID in the environment' >&2; "
      "exit 127; }; "
      "PSTRAIN_LAUNCH_RANK=$r; DMLC_TASK_ID=$((r + o)); "
      "export PSTRAIN_LAUNCH_RANK DMLC_TASK_ID; "
      "if [ \"${DMLC_ROLE:-}\" = worker ] && [ -n \"${SLURM_LOCALID:-}\" ]; then "
      "PSTRAIN_LOCAL_RANK=$SLURM_LOCALID; export PSTRAIN_LOCAL_RANK; "
      "n=${SLURM_NODEID:-0}; i=0; "
      "for e in $(echo \"${SLURM_STEP_TASKS_PER_NODE:-}\" | tr ',' ' '); do "
      "c=${e%%(*}; k=1; case $e in *'(x'*) k=${e#*(x}; k=${k%)};; esac; "
      "if [ \"$n\" -lt $((i + k)) ]; then PSTRAIN_LOCAL_SIZE=$c; export PSTRAIN_LOCAL_SIZE; "
      "break; fi; i=$((i + k)); done; fi; "
      "exec \"$@\"";
  std::vector<std::string> argv = {"srun",
                                   "--jobid=" + job.id,
                                   "--job-name=" + step_name,
                                   StrCat("--ntasks=", count),
                                   StrCat("--nodes=", std::min(count, job.num_nodes)),
                                   "--label",
                                   "--input=none",
                                   "--kill-on-bad-exit=1",
                                   "--overlap"};
  argv.insert(argv.end(), o.srun_options.begin(), o.srun_options.end());
  argv.insert(argv.end(),
              {"/bin/sh", "-c", kRankScript, "pstrain-slurm", std::to_string(task_id_offset)});
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

std::vector<std::string> SallocCommand(const LaunchOptions& o, const std::string& job_id) {
  const int nodes = o.nodes > 0 ? o.nodes : std::max(o.num_servers, o.num_workers);
  std::vector<std::string> argv = {
      "salloc", "--job-name=pstrain-" + job_id, StrCat("--ntasks=", o.num_servers + o.num_workers),
      StrCat("--nodes=", nodes), StrCat("--immediate=", std::max(1, o.alloc_timeout_s))};
  if (!o.partition.empty()) argv.push_back("--partition=" + o.partition);
  if (!o.time_limit.empty()) argv.push_back("--time=" + o.time_limit);
  argv.insert(argv.end(), o.salloc_options.begin(), o.salloc_options.end());
  return argv;
}

// The allocation lives as long as salloc's command, a shell on this host that
// reports the allocation and then reads its stdin, a pipe from the launcher:
// the word "release" ends it, and salloc releases the allocation.
//
// A launcher that dies (even by SIGKILL) SIGTERMs salloc (PR_SET_PDEATHSIG).
// salloc's handler for it completes the job at once, pending or granted, by a
// call to slurmctld that allocates memory. If the command ended at the same
// moment, salloc's main thread would be releasing the job too, and a handler
// that lands while it is inside malloc (logging "Relinquishing job
// allocation") deadlocks salloc: seen 2 times in 6 with Slurm 22.05, when the
// end of stdin (the launcher's death closes the pipe) ended the command. So the
// end of stdin without "release" leaves the command up for 5 s more: the
// handler runs while salloc's main thread waits for the command, and salloc
// exits when the command does (the allocation is already gone by then).
namespace {
constexpr char kGrantedMarker[] = "pstrain-allocation ";
constexpr char kReleaseWord[] = "release\n";
const char* const kHoldScript =
    "echo \"pstrain-allocation ${SLURM_JOB_ID:-} ${SLURM_JOB_NUM_NODES:-1} "
    "${SLURM_JOB_NODELIST:-}\"; while read -r w; do [ \"$w\" = release ] && exit 0; done; "
    "exec sleep 5";

// Reads what `p` wrote into *output (without waiting); false once both pipes are closed.
bool ReadSome(Subprocess& p, std::string* output) {
  for (int fd : {p.stdout_fd(), p.stderr_fd()}) {
    if (fd < 0) continue;
    char buf[4096];
    for (;;) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n > 0) {
        output->append(buf, static_cast<size_t>(n));
        continue;
      }
      if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        if (fd == p.stdout_fd()) {
          p.CloseStdout();
        } else {
          p.CloseStderr();
        }
      }
      break;
    }
  }
  return p.stdout_fd() >= 0 || p.stderr_fd() >= 0;
}

// Waits up to `timeout_ms` for `p` to exit, draining its output into *output.
bool WaitExited(Subprocess& p, int timeout_ms, std::string* output) {
  Deadline deadline = Deadline::InMillis(timeout_ms);
  while (!p.Poll()) {
    if (deadline.Expired()) return false;
    std::vector<pollfd> fds;
    for (int fd : {p.stdout_fd(), p.stderr_fd()}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    if (fds.empty()) {
      usleep(20000);
    } else {
      poll(fds.data(), fds.size(), 50);
    }
    ReadSome(p, output);
  }
  ReadSome(p, output);
  return true;
}
}  // namespace

StatusOr<std::unique_ptr<SlurmAllocation>> SlurmAllocation::Request(
    const LaunchOptions& options, const std::string& job_id,
    const std::map<std::string, std::string>& env, int stop_fd, int* stop_signal, int echo_fd) {
  const std::vector<std::string> request = SallocCommand(options, job_id);
  ProcessSpec spec;
  spec.argv = request;
  spec.argv.insert(spec.argv.end(), {"/bin/sh", "-c", kHoldScript});
  spec.env = env;
  spec.pipe_stdin = true;
  ASSIGN_OR_RETURN(std::unique_ptr<Subprocess> salloc, Subprocess::Start(spec));
  // salloc gives up by itself after --immediate seconds; this deadline only
  // guards against a salloc that does not.
  const Deadline deadline =
      Deadline::InMillis(int64_t{std::max(1, options.alloc_timeout_s)} * 1000 + kQueryTimeoutMs);
  std::string output, failure;
  size_t echoed = 0;  // output up to here has been echoed
  bool stopped = false;
  SlurmJob job;
  while (job.id.empty()) {
    std::vector<pollfd> fds;
    for (int fd : {salloc->stdout_fd(), salloc->stderr_fd()}) {
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});
    }
    if (stop_fd >= 0) fds.push_back({stop_fd, POLLIN, 0});
    poll(fds.data(), fds.size(), 100);
    unsigned char sig = 0;
    if (stop_fd >= 0 && fds.back().revents != 0 && read(stop_fd, &sig, 1) == 1) {
      if (stop_signal != nullptr) *stop_signal = sig;
      stopped = true;
      failure = StrCat("stopped while waiting for the Slurm allocation (",
                       ShellJoinReadable(request), ")");
      break;
    }
    const bool open = ReadSome(*salloc, &output);
    // salloc's own lines ("job 42 queued and waiting for resources") as they come.
    for (size_t nl; (nl = output.find('\n', echoed)) != std::string::npos; echoed = nl + 1) {
      const std::string line = output.substr(echoed, nl + 1 - echoed);
      if (echo_fd >= 0 && line.rfind(kGrantedMarker, 0) != 0 &&
          write(echo_fd, line.data(), line.size()) < 0) {
        echo_fd = -1;  // a closed terminal must not stop the request
      }
    }
    const size_t at = output.find(kGrantedMarker);
    if (at != std::string::npos && output.find('\n', at) != std::string::npos) {
      std::istringstream words(output.substr(at + sizeof(kGrantedMarker) - 1));
      std::string count;
      words >> job.id >> count >> job.nodelist;
      auto nodes = NodeCount("salloc's SLURM_JOB_NUM_NODES", count);
      if (job.id.empty() || !nodes.ok() || job.nodelist.empty()) {
        failure = StrCat("salloc's allocation is not what was expected: ", output);
        job.id.clear();
        break;
      }
      job.num_nodes = *nodes;
      break;
    }
    if ((!open && salloc->Poll()) || deadline.Expired()) {
      failure = StrCat("no Slurm allocation (", ShellJoinReadable(request), "; waited up to ",
                       options.alloc_timeout_s, " s, --alloc-timeout): ");
      break;
    }
  }
  if (job.id.empty()) {
    // Nothing of ours may stay queued or allocated: salloc withdraws its
    // request (or releases a grant) on SIGTERM; scancel whatever it left.
    salloc->SignalGroup(SIGTERM);
    salloc->CloseStdin();
    WaitExited(*salloc, 10000, &output);
    salloc.reset();
    std::vector<std::string> cancel = {"scancel", "--name=pstrain-" + job_id};
    auto user = env.find("USER");
    if (user != env.end() && !user->second.empty()) cancel.push_back("--user=" + user->second);
    (void)RunSlurmCommand(cancel, env);
    while (!output.empty() && output.back() == '\n') output.pop_back();
    if (stopped) return Status::Cancelled(failure);
    return Status::Unavailable(failure + output);
  }
  return std::unique_ptr<SlurmAllocation>(new SlurmAllocation(job, env, std::move(salloc)));
}

SlurmAllocation::~SlurmAllocation() { (void)Release(); }

std::map<std::string, std::string> SlurmAllocation::Variables() const {
  return {{"SLURM_JOB_ID", job_.id},
          {"SLURM_JOB_NODELIST", job_.nodelist},
          {"SLURM_JOB_NUM_NODES", std::to_string(job_.num_nodes)}};
}

Status SlurmAllocation::Release() {
  if (salloc_ == nullptr) return Status::Ok();
  std::unique_ptr<Subprocess> salloc = std::move(salloc_);
  // salloc's command ends on the word, and salloc releases the allocation.
  salloc->WriteStdin(kReleaseWord);
  salloc->CloseStdin();
  std::string output;
  if (WaitExited(*salloc, 20000, &output)) return Status::Ok();
  salloc->SignalGroup(SIGTERM);
  WaitExited(*salloc, 5000, &output);
  auto cancelled = RunSlurmCommand({"scancel", job_.id}, env_);
  if (!cancelled.ok()) {
    return cancelled.status().WithContext(StrCat("releasing Slurm job ", job_.id));
  }
  return Status::Ok();
}

StatusOr<std::vector<std::string>> CancelSlurmSteps(const std::string& job_id,
                                                    const std::vector<std::string>& step_names,
                                                    const std::map<std::string, std::string>& env) {
  ASSIGN_OR_RETURN(std::string out, RunSlurmCommand({"squeue", "--noheader", "--steps",
                                                     "--jobs=" + job_id, "--format=%i %j"},
                                                    env));
  const std::set<std::string> ours(step_names.begin(), step_names.end());
  std::vector<std::string> left;
  for (const std::string& line : Lines(out)) {
    std::istringstream words(line);
    std::string id, name;
    words >> id >> name;
    if (ours.count(name) != 0) left.push_back(id);
  }
  if (left.empty()) return left;
  std::vector<std::string> argv = {"scancel"};
  argv.insert(argv.end(), left.begin(), left.end());
  ASSIGN_OR_RETURN(std::string said, RunSlurmCommand(argv, env));
  return left;
}

}  // namespace pstrain::tracker
