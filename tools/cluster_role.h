// The role a job subcommand (`kvbench`, later `train`) plays in a cluster.
//
// Every process of a job runs the same command line; DMLC_ROLE (or --role,
// which wins) decides what it is. A job subcommand calls RunClusterRole first:
// for the scheduler or a server it runs that role to completion and returns the
// process exit code; for a worker it returns nullopt and the command goes on.
#ifndef PSTRAIN_TOOLS_CLUSTER_ROLE_H_
#define PSTRAIN_TOOLS_CLUSTER_ROLE_H_

#include <optional>

#include "common/env.h"
#include "common/status.h"

namespace pstrain {

// Process-wide malloc settings for nodes that move large messages: keeps
// freed message buffers mapped (no trim, no per-buffer mmap) so a steady
// stream of MB-sized frames does not page-fault on every message. Measured:
// 1.1M page faults and 3.3 s of system time per 330 steps of 16 x 1 MB on a
// server without it. Every role calls it first (RunClusterRole does).
void TuneMallocForMessages();

// The job environment with --role applied over DMLC_ROLE.
StatusOr<JobEnv> ReadClusterEnv();
// ReadClusterEnv for `pstrain scheduler` or `pstrain server`, which run
// `role`: a --role naming another is refused (InvalidArgument), not ignored.
StatusOr<JobEnv> ReadClusterEnvAs(Role role);

// Runs the scheduler or a server to the job's end: 0 on a clean shutdown, 1
// (with the reason logged) otherwise.
int RunSchedulerRole(const JobEnv& env);
int RunServerRole(const JobEnv& env);

// nullopt for a worker; the exit code after running the scheduler or a server.
// A bad environment is logged and gives exit code 2.
std::optional<int> RunClusterRole();

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_CLUSTER_ROLE_H_
