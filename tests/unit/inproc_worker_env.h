// The TrainerEnv of a dist_sync worker inside an in-process job
// (tests/unit/inproc_job.h): the models/ networks and a DistParamSync over
// the worker's KV client, as `pstrain train --kv-store dist_sync` builds it.
#ifndef PSTRAIN_TESTS_UNIT_INPROC_WORKER_ENV_H_
#define PSTRAIN_TESTS_UNIT_INPROC_WORKER_ENV_H_

#include <memory>

#include "common/gradient_compression.h"
#include "models/models.h"
#include "worker/dist_param_sync.h"
#include "worker/kv_client.h"
#include "worker/trainer.h"

namespace pstrain::testing {

// `kv` and `log` outlive the trainer made with it.
inline TrainerEnv DistSyncWorkerEnv(KVClient* kv, TrainLog* log,
                                    const GradientCompression& compression) {
  TrainerEnv env;
  env.log = log;
  env.build_model = BuildModel;
  env.rank = kv->rank();
  env.num_workers = kv->num_workers();
  env.make_sync =
      [kv, compression](const OptimizerConfig& opt) -> StatusOr<std::unique_ptr<ParamSync>> {
    return std::unique_ptr<ParamSync>(
        std::make_unique<DistParamSync>(kv, opt, /*sync_mode=*/true, /*request_timeout_ms=*/60000,
                                        /*barrier_timeout_ms=*/60000, compression));
  };
  return env;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_INPROC_WORKER_ENV_H_
