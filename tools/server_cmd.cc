// `pstrain server`: runs one parameter server of a job (DMLC_* variables).
#include "tools/cluster_role.h"
#include "tools/commands.h"

namespace pstrain {

int RunServerCmd(int /*argc*/, char** /*argv*/) {
  auto env = ReadClusterEnvAs(Role::kServer);
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 2;
  }
  return RunServerRole(*env);
}

}  // namespace pstrain
