// `pstrain scheduler`: runs the scheduler of a job (DMLC_* variables).
#include "tools/cluster_role.h"
#include "tools/commands.h"

namespace pstrain {

int RunSchedulerCmd(int /*argc*/, char** /*argv*/) {
  auto env = ReadClusterEnvAs(Role::kScheduler);
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 2;
  }
  return RunSchedulerRole(*env);
}

}  // namespace pstrain
