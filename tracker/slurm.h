// The Slurm launcher's parts (pstrain launch --launcher slurm): the
// allocation, the srun steps of a job, and the cleanup after it.
//
// Mapping (PlanLaunch builds it from these helpers):
//   scheduler  runs where `pstrain launch` runs, as with every launcher: the
//              submit host under salloc, the batch host under sbatch; its
//              address is one the allocated nodes reach (--host-ip, else
//              DetectHostIp over the nodes' NodeAddr).
//   servers    one srun step of S tasks named pstrain-<job>-servers,
//   workers    one srun step of W tasks named pstrain-<job>-workers, both in
//              the same allocation and sharing its nodes (--overlap); each
//              step spreads over min(tasks, allocated nodes) nodes and Slurm
//              places its tasks (its default block distribution).
//   ranks      task r of the server step is server-r, of the worker step
//              worker-r: a constant /bin/sh wrapper sets
//              PSTRAIN_LAUNCH_RANK=$SLURM_PROCID and DMLC_TASK_ID
//              (servers 0..S-1, workers S..S+W-1, as the ssh launcher).
//   output     srun --label tags each line with the task; the supervisor
//              splits them into <role>-<rank>.log (srun's own lines go to
//              srun-servers.log / srun-workers.log).
//   failure    --kill-on-bad-exit ends a step when one of its tasks fails;
//              srun's notice "srun: error: NODE: task R: Exited with exit
//              code C" fails the job at once, naming the process.
//   stopping   SIGTERM to srun cancels its step; whatever step is still
//              listed after the job (a srun killed outright) is scancelled.
//
// Outside an allocation `pstrain launch` first asks for one
// (SlurmAllocation): salloc --job-name=pstrain-<job> --ntasks=S+W --nodes=N
// (--nodes, else max(S, W): one server and one worker per node, as
// dmlc-core's slurm tracker) [--partition P] [--time T] --immediate=SECONDS
// running a shell here that holds the allocation until the launcher closes
// its stdin, or dies: it cannot outlive the launcher.
//
// Thread safety: none of this is shared between threads.
#ifndef PSTRAIN_TRACKER_SLURM_H_
#define PSTRAIN_TRACKER_SLURM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "tracker/hostfile.h"
#include "tracker/launcher.h"
#include "tracker/process.h"

namespace pstrain::tracker {

// The allocation a job runs in.
struct SlurmJob {
  std::string id;        // SLURM_JOB_ID
  std::string nodelist;  // Slurm's compressed form, "node[1-3]"; may be empty
  int num_nodes = 1;     // how many nodes it holds
};

// The allocation the environment names: SLURM_JOB_ID (or SLURM_JOBID),
// SLURM_JOB_NODELIST (or SLURM_NODELIST), SLURM_JOB_NUM_NODES (or
// SLURM_NNODES; default 1). NotFound when no job id is set; InvalidArgument
// naming a malformed variable.
StatusOr<SlurmJob> SlurmJobFromEnvironment(const Environment& env);

// The nodes of `nodelist` by the addresses Slurm reaches them at (NodeAddr,
// from sinfo), for DetectHostIp. `env` is the environment sinfo runs with.
StatusOr<std::vector<Host>> SlurmNodeAddresses(const std::string& nodelist,
                                               const std::map<std::string, std::string>& env);

// "pstrain-<job_id>-servers" for role "server", "...-workers" for "worker".
std::string SlurmStepName(const std::string& job_id, const std::string& role);

// The srun command of one role's step, up to and including `command`: `count`
// tasks of `job` whose task ids start at `task_id_offset`; the options' srun
// arguments come after ours (so they win where srun takes the last value).
std::vector<std::string> SrunCommand(const LaunchOptions& options, const SlurmJob& job,
                                     const std::string& step_name, int count, int task_id_offset,
                                     const std::vector<std::string>& command);

// The salloc request for the allocation of job `job_id` (its options; the
// command that holds the allocation follows them).
std::vector<std::string> SallocCommand(const LaunchOptions& options, const std::string& job_id);

// An allocation the launcher asked for, held by a salloc child process;
// destroying it releases it.
class SlurmAllocation {
 public:
  // Runs SallocCommand and waits for the grant, up to options.alloc_timeout_s
  // (salloc --immediate; the wait also ends, with Cancelled, when a byte can
  // be read from `stop_fd`, -1: never; *stop_signal then holds it). Returns
  // the allocation with its nodes; Unavailable with salloc's words when it
  // was refused or not granted in time. Nothing is left queued on failure.
  // `env` is salloc's environment; salloc's lines go to `echo_fd` as they
  // come while it waits (-1: nowhere).
  static StatusOr<std::unique_ptr<SlurmAllocation>> Request(
      const LaunchOptions& options, const std::string& job_id,
      const std::map<std::string, std::string>& env, int stop_fd, int* stop_signal,
      int echo_fd = -1);

  ~SlurmAllocation();
  SlurmAllocation(const SlurmAllocation&) = delete;
  SlurmAllocation& operator=(const SlurmAllocation&) = delete;

  const SlurmJob& job() const { return job_; }
  // What to add to the launcher's environment to plan inside it:
  // SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_JOB_NUM_NODES.
  std::map<std::string, std::string> Variables() const;
  // Releases the allocation now and waits (bounded) until Slurm has it back:
  // salloc's command ends, salloc gives the allocation up; scancel if salloc
  // does not exit in time. Idempotent. An error says why scancel failed (the
  // allocation then ends at its time limit).
  Status Release();

 private:
  SlurmAllocation(SlurmJob job, std::map<std::string, std::string> env,
                  std::unique_ptr<Subprocess> salloc)
      : job_(std::move(job)), env_(std::move(env)), salloc_(std::move(salloc)) {}

  SlurmJob job_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<Subprocess> salloc_;  // null once released
};

// Cancels the steps of job `job_id` named in `step_names` that Slurm still
// lists (squeue, then scancel). Returns the step ids it cancelled ("5.1").
StatusOr<std::vector<std::string>> CancelSlurmSteps(const std::string& job_id,
                                                    const std::vector<std::string>& step_names,
                                                    const std::map<std::string, std::string>& env);

}  // namespace pstrain::tracker

#endif  // PSTRAIN_TRACKER_SLURM_H_
