// DistParamSync on its own in an in-process job: what happens around its
// requests when they fail.
#include "worker/dist_param_sync.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "models/models.h"
#include "nn/executor.h"
#include "tests/test_util.h"
#include "tests/unit/inproc_job.h"

namespace pstrain {
namespace {

// A request that Init stops waiting for may still be answered into Init's
// own buffers: whichever of Init's waits fails (here every deadline is 0 ms,
// so the first, the configuration's, does), the node is failed and stopped
// before Init returns, so nothing is written after they are gone.
TEST(DistParamSyncTest, AnInitThatStopsWaitingStopsTheNodeFirst) {
  testing::JobResult r = testing::RunJob(1, 1, [](KVClient& kv) -> Status {
    StatusOr<Graph> g = BuildModel({"mlp", 0, Shape(), 0});
    RETURN_IF_ERROR(g.status());
    ExecutorOptions eo;
    eo.batch_size = 2;
    ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, Executor::Create(*g, eo));
    OptimizerConfig oc;
    oc.set_learning_rate(0.1f);
    DistParamSync sync(&kv, oc, /*sync_mode=*/true, /*request_timeout_ms=*/0,
                       /*barrier_timeout_ms=*/60000, GradientCompression());
    Status s = sync.Init(exec.get());
    if (s.code() != StatusCode::kDeadlineExceeded) {
      return Status::Internal(StrCat("expected a deadline, got ", s.ToString()));
    }
    Message m;
    Status sent = kv.node()->Send(kSchedulerId, m);
    if (sent.code() != StatusCode::kCancelled) {
      return Status::Internal(StrCat("the node still sends: ", sent.ToString()));
    }
    return s;
  });
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_EQ(r.workers[0].code(), StatusCode::kDeadlineExceeded) << r.workers[0];
  EXPECT_NE(r.workers[0].message().find("not done by its deadline"), std::string::npos)
      << r.workers[0];
}

}  // namespace
}  // namespace pstrain
