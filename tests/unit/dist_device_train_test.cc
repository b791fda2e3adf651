// A distributed worker whose devices the host cannot address (the CPU playing
// a GPU: BackendOptions::cpu_as_device) trains exactly as a worker on host
// memory does, in an in-process dist_sync job of 2 servers and 2 workers on
// real MNIST. This runs in CI the paths that GPU workers take and that no
// other test without a GPU reaches:
//   - DistParamSync on a device: each gradient downloaded into pinned host
//     memory and pushed by the pusher thread once its fence is done, each
//     pulled weight uploaded before the layer that reads it;
//   - dist_sync over two devices: the local merge's downloads and merge
//     thread, which then call the sync;
//   - dist_device_sync over two devices: the merge on device 0 (copies from
//     the other device), and the sync's device path after it.
// The servers sum two workers' gradients (a + b = b + a), so two runs of the
// job give the same bits, and any step the device paths lose or take out of
// order shows.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "models/models.h"
#include "tests/test_util.h"
#include "tests/unit/inproc_job.h"
#include "tests/unit/inproc_worker_env.h"
#include "worker/train_config.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

struct JobRun {
  std::vector<std::vector<float>> params;  // worker 0's, per parameter
  double accuracy = 0;                     // worker 0's last validation accuracy
};

// One job; every worker's devices are `devices` CPUs, as devices or not.
JobRun TrainJob(const std::string& kv_store, int devices, bool as_device) {
  TrainConfig cfg;
  cfg.set_network("mlp");
  cfg.set_data_dir(testing::SharedDataDir() + "/mnist");
  cfg.set_num_examples(7680);  // 30 batches of 128 per worker
  cfg.set_num_epochs(2);
  cfg.set_lr(0.1f);
  cfg.set_kv_store(kv_store);
  cfg.set_num_threads(1);
  cfg.set_seed(5);
  JobRun run;
  testing::JobSpec spec;
  spec.tweak_all = [](ClusterOptions* o) { o->heartbeat_timeout_ms = 20000; };
  testing::JobResult r = testing::RunJobWith(
      2, 2,
      [&](KVClient& kv) -> Status {
        TrainLog log([](const std::string&) {});
        TrainerEnv env = testing::DistSyncWorkerEnv(&kv, &log, GradientCompression());
        env.adjust_devices = [devices, as_device](DeviceGroupOptions* go) {
          go->devices.assign(devices, go->devices[0]);
          for (BackendOptions& b : go->devices) b.cpu_as_device = as_device;
        };
        ASSIGN_OR_RETURN(std::unique_ptr<Trainer> t, Trainer::Create(cfg, env));
        if (t->devices().executor(0).backend().host_accessible() == as_device) {
          return Status::Internal("the devices are not what the test asked for");
        }
        RETURN_IF_ERROR(t->Run());
        if (kv.rank() != 0) return Status::Ok();
        const ModelParams& p = t->params();
        for (int i = 0; i < p.num_params(); ++i) {
          std::vector<float>& v = run.params.emplace_back(p.param(i).num_elements());
          RETURN_IF_ERROR(p.ReadParam(i, v.data(), v.size()));
        }
        if (t->history().empty() || t->history().back().val.empty()) {
          return Status::Internal("no validation accuracy");
        }
        run.accuracy = t->history().back().val[0].second;
        return Status::Ok();
      },
      spec);
  testing::ExpectAllOk(r);
  return run;
}

class DistDeviceTrainTest
    : public ::testing::TestWithParam<std::pair<const char* /*kv_store*/, int /*devices*/>> {};

TEST_P(DistDeviceTrainTest, WorkersOnDevicesTrainExactlyAsWorkersOnTheHost) {
  const auto [kv_store, devices] = GetParam();
  const JobRun host = TrainJob(kv_store, devices, /*as_device=*/false);
  const JobRun dev = TrainJob(kv_store, devices, /*as_device=*/true);
  ASSERT_FALSE(host.params.empty());
  ASSERT_EQ(dev.params.size(), host.params.size());
  for (size_t i = 0; i < host.params.size(); ++i) {
    EXPECT_EQ(dev.params[i], host.params[i]) << "parameter " << i;
  }
  EXPECT_EQ(dev.accuracy, host.accuracy);
  EXPECT_GT(host.accuracy, 0.8) << "it learns";
}

INSTANTIATE_TEST_SUITE_P(KvStores, DistDeviceTrainTest,
                         ::testing::Values(std::pair<const char*, int>{"dist_sync", 1},
                                           std::pair<const char*, int>{"dist_sync", 2},
                                           std::pair<const char*, int>{"dist_device_sync", 2}),
                         [](const ::testing::TestParamInfo<std::pair<const char*, int>>& info) {
                           return StrCat(info.param.first, "_", info.param.second, "_devices");
                         });

}  // namespace
}  // namespace pstrain
