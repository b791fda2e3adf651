// `pstrain train`: MXNet fit.py's training for one worker.
//
// Every process of a job runs this same command: the scheduler and the
// servers leave through the cluster-role hook; a worker with a `dist_*`
// --kv-store joins the cluster and exchanges its parameters with the servers;
// `local` and `device` train in this process alone.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/env.h"
#include "data/dataset_get.h"
#include "data/dataset_manifest.h"
#include "models/models.h"
#include "net/cluster_node.h"
#include "net/host_address.h"
#include "nn/optimizer.h"
#include "tools/cluster_role.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"
#include "tools/image_flags.h"
#include "worker/dist_param_sync.h"
#include "worker/kv_client.h"
#include "worker/train_config.h"
#include "worker/train_log.h"
#include "worker/trainer.h"

namespace pstrain {
namespace {

// Readers for --data-train / --data-val RecordIO files of images, or .lst image
// lists under --data-root (the image pipeline, data/image_record_iter.h),
// partitioned over the workers.
StatusOr<TrainData> OpenImageData(const TrainConfig& cfg, int rank, int num_workers) {
  ASSIGN_OR_RETURN(std::vector<int64_t> shape, ParseIntList(cfg.image_shape(), "--image-shape"));
  if (shape.size() != 3) {
    return Status::InvalidArgument(StrCat("--image-shape '", cfg.image_shape(),
                                          "' must be C,H,W for image data (--data-train ",
                                          FLAGS_data_train, ")"));
  }
  if (cfg.num_classes() <= 0) {
    return Status::InvalidArgument(
        StrCat("--num-classes is required with image data (--data-train ", FLAGS_data_train, ")"));
  }
  TrainData out;
  out.kind = "recordio";
  out.image_shape = shape;
  out.num_classes = cfg.num_classes();
  auto open = [&](ImageDataSplit split) -> StatusOr<std::unique_ptr<ImageRecordIter>> {
    ASSIGN_OR_RETURN(
        ImageRecordIterConfig ic,
        ImageRecordIterConfigFromFlags(split, cfg.batch_size(), shape[0], shape[1], shape[2], rank,
                                       num_workers, static_cast<uint64_t>(cfg.seed())));
    if (split == ImageDataSplit::kTrain) ic.shuffle = cfg.shuffle_train() != 0;
    return ImageRecordIter::Create(ic);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<ImageRecordIter> train, open(ImageDataSplit::kTrain));
  // Without --num-examples an epoch is floor(N / W) of all N records on every
  // worker: the parts differ by a few records (split by bytes, or ceil(N/P)
  // with a .idx), and in dist_sync every worker must run as many batches.
  // Counting a bare .rec's other parts reads their headers: only then.
  if (cfg.num_examples() == 0) {
    ASSIGN_OR_RETURN(out.total_train_examples, train->CountAllExamples());
  }
  out.train = std::move(train);
  if (!FLAGS_data_val.empty()) {
    ASSIGN_OR_RETURN(out.val, open(ImageDataSplit::kVal));
  }
  return out;
}

// --dataset: sets data_dir to the folder that holds the data set, fetched
// there first when needed (data/dataset_get.h has the search order).
Status ResolveDataset(TrainConfig* cfg, TrainLog* log) {
  ASSIGN_OR_RETURN(DatasetManifest manifest, FindManifest(cfg->dataset()));
  ASSIGN_OR_RETURN(DataEnv env, ReadDataEnv(Environment()));
  std::unique_ptr<FetchProgress> progress = NewConsoleProgress(stderr, isatty(STDERR_FILENO));
  GetOptions options;
  options.fetch.progress = progress.get();
  options.mirrors = env.mirrors;
  ASSIGN_OR_RETURN(Located found, EnsureDataset(manifest, cfg->data_dir(), env, options));
  log->Info(StrCat("data set ", manifest.name(), ": ", found.dir, " (", found.origin, ")"));
  cfg->set_data_dir(found.dir);
  return Status::Ok();
}

int Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "pstrain train: %s%s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int RunTrain(int /*argc*/, char** /*argv*/) {
  if (std::optional<int> code = RunClusterRole()) return *code;
  auto cfg = TrainConfigFromFlags();
  if (!cfg.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  // A wrong network name is found now, not after the data has loaded (which
  // for ImageNet takes minutes) or the cluster has formed.
  const std::vector<std::string> models = KnownModels();
  if (cfg->test_io() == 0 &&
      std::find(models.begin(), models.end(), cfg->network()) == models.end()) {
    std::string known;
    for (const std::string& m : models) known += (known.empty() ? "" : ", ") + m;
    std::fprintf(stderr, "pstrain train: --network='%s' is not a known model (known: %s)\n",
                 cfg->network().c_str(), known.c_str());
    return 2;
  }
  if (Status s = InitializerFromConfig(*cfg).status(); !s.ok()) {
    std::fprintf(stderr, "pstrain train: %s\n", s.ToString().c_str());
    return 2;
  }
  // A misspelt --dataset too (it is looked up again when the data is found).
  if (!cfg->dataset().empty() && cfg->benchmark() == 0) {
    if (Status s = FindManifest(cfg->dataset()).status(); !s.ok()) {
      std::fprintf(stderr, "pstrain train: --dataset: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  TrainLog log;
  // Locates the data set (fetching what is missing) and logs the arguments. A
  // worker of a cluster does so once it has joined, as MXNet's fit.py creates
  // the kvstore before the data: a download longer than the scheduler's
  // start-up timeout does not fail the job, and heartbeats go on meanwhile.
  auto prepare = [&]() -> Status {
    if (!cfg->dataset().empty() && cfg->benchmark() == 0) {
      RETURN_IF_ERROR(ResolveDataset(&*cfg, &log));
    }
    std::string text = EffectiveConfigText(*cfg);
    std::string one_line;
    for (char c : text) one_line += c == '\n' ? std::string("; ") : std::string(1, c);
    log.Info("start with arguments " + one_line);
    return Status::Ok();
  };
  // dist_sync, dist_async, dist_device_sync, ...: a worker of a cluster.
  const bool dist = cfg->kv_store().find("dist") != std::string::npos;
  if (!dist) {
    // A worker that `pstrain launch` (or mpirun, ssh, srun) started into a
    // cluster but that trains alone: the scheduler would wait for it until
    // its start-up deadline and then fail the job, naming a server.
    const Environment process_env;
    const std::optional<std::string> role = process_env.Get("DMLC_ROLE");
    std::optional<std::string> root = process_env.Get("DMLC_PS_ROOT_URI");
    if (role == "worker" && root.has_value()) {
      if (std::optional<std::string> port = process_env.Get("DMLC_PS_ROOT_PORT")) {
        *root = JoinHostPort(*root, *port);
      }
      std::fprintf(stderr,
                   "pstrain train: this process is a worker of a cluster (DMLC_ROLE=worker, "
                   "scheduler at %s), but --kv-store %s trains alone and never joins it: pass "
                   "--kv-store dist_sync (or dist_async, dist_device_sync) to train with the "
                   "servers, or run it outside a cluster (without DMLC_ROLE)\n",
                   root->c_str(), cfg->kv_store().c_str());
      return 2;
    }
    if (Status s = prepare(); !s.ok()) return Fail("", s);
  }
  TrainerEnv env;
  env.log = &log;
  env.build_model = BuildModel;
  // --config may name the RecordIO files; the image flags read them from there too.
  if (FLAGS_data_train.empty() && !cfg->data_train().empty()) FLAGS_data_train = cfg->data_train();
  if (FLAGS_data_val.empty() && !cfg->data_val().empty()) FLAGS_data_val = cfg->data_val();
  // --benchmark 1 trains on synthetic data whatever names the real data (fit.py).
  if (cfg->benchmark() == 0 && !FLAGS_data_train.empty()) {
    const TrainConfig& c = *cfg;
    env.open_data = [&c](int rank, int num_workers) { return OpenImageData(c, rank, num_workers); };
  }

  std::unique_ptr<ClusterNode> node;
  std::unique_ptr<KVClient> kv;
  JobEnv job;
  auto fail_job = [&](const char* what, const Status& s) {
    if (node != nullptr) {
      node->Fail(s);  // the others learn of it at once
      // The requests the failure abandoned may still be read (ZeroMQ's
      // frames, sent as the sockets close) or written (replies) until the
      // node stops (kv_client.h): stop it while their buffers, the trainer's
      // (pinned host memory on a GPU), still exist. The client stays: the
      // trainer still waits through it for what the failure abandoned.
      node->Stop();
    }
    return Fail(what, s);
  };
  if (dist) {
    auto read = ReadClusterEnv();
    if (!read.ok()) return Fail("", read.status());
    job = *read;
    TuneMallocForMessages();
    auto created = ClusterNode::Create(ClusterOptionsFromJobEnv(job));
    if (!created.ok()) return Fail("", created.status());
    node = std::move(created).value();
    kv = std::make_unique<KVClient>(node.get(), KVClientOptionsFromJobEnv(job));
    Status s = kv->Start();
    if (!s.ok()) return Fail("joining the cluster: ", s);
    if (s = prepare(); !s.ok()) return fail_job("", s);
    env.rank = kv->rank();
    env.num_workers = kv->num_workers();
    const bool sync_mode = cfg->kv_store().find("async") == std::string::npos;
    if (env.rank == 0) {
      if (std::string hint = DistAsyncMomentumHint(*cfg, env.num_workers); !hint.empty()) {
        log.Info(hint);
      }
    }
    // Valid: TrainConfigFromFlags checked it.
    auto gc = ParseGradientCompression(cfg->gc_type(), cfg->gc_threshold());
    if (!gc.ok()) return Fail("", gc.status());
    KVClient* client = kv.get();
    env.make_sync = [client, sync_mode, job,
                     gc = *gc](const OptimizerConfig& opt) -> StatusOr<std::unique_ptr<ParamSync>> {
      return std::unique_ptr<ParamSync>(std::make_unique<DistParamSync>(
          client, opt, sync_mode, job.request_timeout_ms, job.barrier_timeout_ms, gc));
    };
  }

  auto trainer = Trainer::Create(*cfg, env);
  if (!trainer.ok()) return fail_job("", trainer.status());
  Status s = (*trainer)->Run();
  if (!s.ok()) return fail_job("", s);
  trainer->reset();  // settles the parameter exchanges before the client goes
  if (kv != nullptr) {
    s = kv->Finish(Deadline::InMillis(job.barrier_timeout_ms));
    if (!s.ok()) return Fail("finishing the job: ", s);
  }
  return 0;
}

}  // namespace pstrain
