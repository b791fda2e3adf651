// DistParamSync on its own in an in-process job: what happens around its
// requests when they fail.
#include "worker/dist_param_sync.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/executor.h"
#include "tests/test_util.h"
#include "tests/unit/inproc_job.h"

namespace pstrain {
namespace {

// The executor of the tests: the MLP on a batch of 2.
StatusOr<std::unique_ptr<Executor>> MlpExecutor() {
  ASSIGN_OR_RETURN(Graph g, BuildModel({"mlp", 0, Shape(), 0}));
  ExecutorOptions eo;
  eo.batch_size = 2;
  return Executor::Create(g, eo);
}

// A request that Init stops waiting for may still be answered into Init's
// own buffers: whichever of Init's waits fails (here every deadline is 0 ms,
// so the first, the configuration's, does), the node is failed and stopped
// before Init returns, so nothing is written after they are gone.
TEST(DistParamSyncTest, AnInitThatStopsWaitingStopsTheNodeFirst) {
  testing::JobResult r = testing::RunJob(1, 1, [](KVClient& kv) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, MlpExecutor());
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

// OnGradReady twice for one parameter before WaitParam (not the training
// loop's order): the first exchange is settled before the second is issued,
// so both are applied, in order, and Drain waits for both.
TEST(DistParamSyncTest, AGradientHandedOverTwiceIsExchangedTwiceInOrder) {
  testing::JobResult r = testing::RunJob(1, 1, [](KVClient& kv) -> Status {
    ASSIGN_OR_RETURN(std::unique_ptr<Executor> exec, MlpExecutor());
    OptimizerConfig oc;
    oc.set_type(OptimizerConfig::TEST);  // w += g
    DistParamSync sync(&kv, oc, /*sync_mode=*/true, /*request_timeout_ms=*/60000,
                       /*barrier_timeout_ms=*/60000, GradientCompression());
    RETURN_IF_ERROR(sync.Init(exec.get()));
    const size_t n = static_cast<size_t>(exec->param(0).num_elements());
    std::vector<float> before(n), after(n);
    RETURN_IF_ERROR(exec->ReadParam(0, before.data(), n));
    std::fill(exec->host_grad(0), exec->host_grad(0) + n, 0.25f);
    sync.OnGradReady(0);
    sync.OnGradReady(0);
    RETURN_IF_ERROR(sync.Drain());
    RETURN_IF_ERROR(exec->ReadParam(0, after.data(), n));
    for (size_t j = 0; j < n; ++j) {
      if (std::fabs(after[j] - (before[j] + 0.5f)) > 1e-6f) {
        return Status::Internal(
            StrCat("element ", j, ": ", after[j], ", expected ", before[j], " + 2 x 0.25"));
      }
    }
    return Status::Ok();
  });
  ASSERT_EQ(r.workers.size(), 1u);
  EXPECT_OK(r.workers[0]);
}

}  // namespace
}  // namespace pstrain
