#include "tools/cluster_role.h"

#include <gflags/gflags.h>
#include <malloc.h>

#include "net/cluster_node.h"
#include "net/host_address.h"
#include "scheduler/scheduler.h"
#include "server/kv_server.h"

DEFINE_string(role, "",
              "scheduler, server or worker; overrides DMLC_ROLE (default worker). pstrain "
              "scheduler and server run their own role and take only that one");

namespace pstrain {

void TuneMallocForMessages() {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: buffers up to 32 MB from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // keep up to 1 GB of freed heap mapped
}

StatusOr<JobEnv> ReadClusterEnv() {
  Environment env;
  ASSIGN_OR_RETURN(JobEnv job, ReadJobEnv(env, /*cluster_required=*/true));
  if (!FLAGS_role.empty()) {
    ASSIGN_OR_RETURN(job.role, ParseRole(FLAGS_role));
  }
  return job;
}

StatusOr<JobEnv> ReadClusterEnvAs(Role role) {
  if (!FLAGS_role.empty()) {
    ASSIGN_OR_RETURN(const Role asked, ParseRole(FLAGS_role));
    if (asked != role) {
      return Status::InvalidArgument(StrCat("--role ", FLAGS_role, " given to pstrain ",
                                            RoleName(role), ", which runs the ", RoleName(role),
                                            " (pstrain train or kvbench take any role)"));
    }
  }
  ASSIGN_OR_RETURN(JobEnv job, ReadClusterEnv());
  job.role = role;
  return job;
}

int RunSchedulerRole(const JobEnv& env) {
  TuneMallocForMessages();
  ClusterOptions o = ClusterOptionsFromJobEnv(env);
  auto sched = Scheduler::Create(o);
  if (!sched.ok()) {
    LOG(ERROR) << "scheduler: " << sched.status();
    return 1;
  }
  LOG(INFO) << "scheduler: listening on port " << (*sched)->port() << " for " << env.num_servers
            << " servers and " << env.num_workers << " workers";
  Status s = (*sched)->Run();
  if (!s.ok()) {
    LOG(ERROR) << "scheduler: job failed: " << s;
    return 1;
  }
  LOG(INFO) << "scheduler: every worker finished; job done";
  return 0;
}

int RunServerRole(const JobEnv& env) {
  TuneMallocForMessages();
  auto node = ClusterNode::Create(ClusterOptionsFromJobEnv(env));
  if (!node.ok()) {
    LOG(ERROR) << "server: " << node.status();
    return 1;
  }
  KVServerOptions so;
  so.num_threads = env.server_threads;
  so.skip_nonfinite = env.skip_nonfinite;
  so.round_timeout_ms = env.round_timeout_ms;
  if (!env.snapshot_dir.empty()) {
    // One folder per server rank: the launcher's rank, which the scheduler
    // keeps (checked once the node table came).
    if (env.launch_rank < 0) {
      LOG(ERROR) << "server: PSTRAIN_SNAPSHOT_DIR needs PSTRAIN_LAUNCH_RANK (this server's rank; "
                    "`pstrain launch` sets it) to know whose snapshots are whose";
      return 2;
    }
    so.snapshot_dir = StrCat(env.snapshot_dir, "/server-", env.launch_rank);
    so.snapshot_rank = env.launch_rank;
    so.snapshot_sync = env.snapshot_sync;
  }
  // Also without a snapshot folder: a restart then refuses to start
  // (KVServer::Run), instead of registering with nothing to resume.
  so.restart = env.restart;
  // Said before the server stops: closing the sockets may wait (up to the
  // linger time) for messages a dead peer never takes.
  KVServer server(node->get(), so);
  // A first line: the live view of the job (pstrain launch, top) shows the
  // server running rather than starting.
  LOG(INFO) << "server: joining the job of the scheduler at "
            << JoinHostPort(env.root_uri, env.root_port);
  const Status s = server.Run();
  if (!s.ok()) {
    LOG(ERROR) << (*node)->Self() << ": " << s;
    return 1;
  }
  LOG(INFO) << (*node)->Self() << ": job done after " << server.requests_served()
            << " requests, holding " << server.keys_held() << " keys";
  return 0;
}

std::optional<int> RunClusterRole() {
  // The role alone first: a worker outside any cluster (`pstrain train
  // --kv-store local`) needs no DMLC_* variables at all.
  Environment process_env;
  auto role_only = ReadJobEnv(process_env, /*cluster_required=*/false);
  Role role = role_only.ok() ? role_only->role : Role::kWorker;
  if (!role_only.ok()) {
    LOG(ERROR) << role_only.status();
    return 2;
  }
  if (!FLAGS_role.empty()) {
    auto parsed = ParseRole(FLAGS_role);
    if (!parsed.ok()) {
      LOG(ERROR) << parsed.status();
      return 2;
    }
    role = *parsed;
  }
  if (role == Role::kWorker) return std::nullopt;
  auto env = ReadClusterEnv();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 2;
  }
  switch (env->role) {
    case Role::kScheduler:
      return RunSchedulerRole(*env);
    case Role::kServer:
      return RunServerRole(*env);
    case Role::kWorker:
      return std::nullopt;
  }
  return 2;
}

}  // namespace pstrain
