#include "worker/trainer.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "nn/initializer.h"
#include "worker/checkpoint.h"
#include "worker/metrics.h"
#include "worker/train_config.h"

namespace pstrain {
namespace {

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

StatusOr<InitializerSpec> InitializerFromConfig(const TrainConfig& cfg) {
  const std::string& text = cfg.initializer();
  StatusOr<InitializerSpec> spec =
      InitializerSpec::Parse(text == "default" ? "xavier(gaussian,in,2)" : text);
  if (!spec.ok()) return spec.status().WithContext("--initializer");
  return spec;
}

Trainer::Trainer(const TrainConfig& cfg, TrainerEnv env) : cfg_(cfg), env_(std::move(env)) {}
Trainer::~Trainer() {
  // No merge may call into sync_ once it is gone (an error left some running).
  if (exec_ != nullptr) exec_->Drain();
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainConfig& cfg, TrainerEnv env) {
  CHECK(env.log != nullptr);
  CHECK(env.build_model != nullptr);
  RETURN_IF_ERROR(ValidateTrainConfig(cfg));
  if (env.num_workers < 1 || env.rank < 0 || env.rank >= env.num_workers) {
    return Status::InvalidArgument(
        StrCat("worker rank ", env.rank, " of ", env.num_workers, " is out of range"));
  }
  std::unique_ptr<Trainer> t(new Trainer(cfg, std::move(env)));
  RETURN_IF_ERROR(t->Init());
  return t;
}

Status Trainer::Init() {
  const bool emulated = cfg_.emulate_compute() > 0;
  if (EmulationNeedsNoData(cfg_)) {
    // The flags say what the data would: nothing is opened.
    ASSIGN_OR_RETURN(data_.image_shape, ParseIntList(cfg_.image_shape(), "--image-shape"));
    data_.num_classes = cfg_.num_classes() > 0 ? cfg_.num_classes() : 10;
    data_.total_train_examples = cfg_.num_examples();
    data_.kind = "none";
  } else if (env_.open_data) {
    ASSIGN_OR_RETURN(data_, env_.open_data(env_.rank, env_.num_workers));
  } else {
    ASSIGN_OR_RETURN(data_, OpenTrainData(cfg_, env_.rank, env_.num_workers));
  }
  const int64_t n = cfg_.num_examples() > 0 ? cfg_.num_examples() : data_.total_train_examples;
  epoch_size_ = EpochSize(n, env_.num_workers, cfg_.batch_size());
  if (epoch_size_ < 1) {
    return Status::InvalidArgument(StrCat(n, " examples over ", env_.num_workers,
                                          " workers make no batch of ", cfg_.batch_size()));
  }
  if (emulated) {
    // Only the shapes and the count are used: no batch is ever read.
    env_.log->Info(StrCat("train data: ", data_.train ? data_.train->Describe() : "not opened",
                          ", not read (compute is emulated): ", n, " examples of ",
                          Shape(data_.image_shape).ToString(), ", ", data_.num_classes,
                          " classes; ", epoch_size_, " batches per epoch"));
    data_.train.reset();
    data_.val.reset();
  } else {
    env_.log->Info(
        StrCat("train data: ", data_.train->Describe(), "; ", epoch_size_, " batches per epoch"));
    if (data_.val) env_.log->Info(StrCat("validation data: ", data_.val->Describe()));
  }
  if (cfg_.test_io() != 0) return Status::Ok();

  ModelOptions mo;
  mo.name = cfg_.network();
  mo.num_layers = cfg_.num_layers();
  mo.image_shape = Shape(data_.image_shape);
  mo.num_classes = data_.num_classes;
  ASSIGN_OR_RETURN(graph_, env_.build_model(mo));
  RETURN_IF_ERROR(emulated ? InitEmulated() : InitDevices());

  ASSIGN_OR_RETURN(InitializerSpec init, InitializerFromConfig(cfg_));
  InitializeParams(init, cfg_.seed(), params_);

  ASSIGN_OR_RETURN(OptimizerConfig opt, MakeOptimizerConfig(cfg_, epoch_size_, env_.num_workers));
  if (env_.make_sync) {
    ASSIGN_OR_RETURN(sync_, env_.make_sync(opt));
  } else if (cfg_.kv_store() == "local" || cfg_.kv_store() == "device") {
    ASSIGN_OR_RETURN(std::unique_ptr<LocalParamSync> local, LocalParamSync::Create(opt));
    sync_ = std::move(local);
  } else {
    return Status::FailedPrecondition(StrCat("--kv-store ", cfg_.kv_store(),
                                             " needs a cluster (start it with `pstrain launch`)"));
  }
  std::vector<NamedArray> states;
  if (cfg_.load_epoch() > 0) {
    RETURN_IF_ERROR(LoadCheckpoint(cfg_.load_epoch(), &states));
  }
  RETURN_IF_ERROR(sync_->Init(params_));
  if (!states.empty()) {
    RETURN_IF_ERROR(sync_->LoadState(states).WithContext(
        StrCat("the optimizer state of epoch ", cfg_.load_epoch())));
  }
  if (exec_ != nullptr) {
    ParamSync* sync = sync_.get();
    exec_->SetGradReadyCallback([sync](int i) { sync->OnGradReady(i); });
    exec_->SetParamNeededCallback([sync](int i) { sync->WaitParam(i); });
  }
  env_.log->Info(StrCat("optimizer: ", opt.ShortDebugString()));
  return Status::Ok();
}

StatusOr<DeviceGroupOptions> TrainingDeviceGroupOptions(const TrainConfig& cfg) {
  DeviceGroupOptions go;
  go.batch_size = cfg.batch_size();
  ASSIGN_OR_RETURN(const TrainingDevices devices, ParseTrainingDevices(cfg));
  go.devices.clear();
  for (int gpu : devices.gpus) {
    BackendOptions b;
    b.device = Device::Gpu(gpu);
    b.gpu_tf32 = devices.tf32;
    b.gpu_conv_graph = devices.conv_graph;
    go.devices.push_back(b);
  }
  if (go.devices.empty()) go.devices.emplace_back();  // the CPU
  for (BackendOptions& b : go.devices) b.num_threads = cfg.num_threads();
  go.weights = devices.weights;
  // MXNet: `device` and `dist_device_sync` sum on a GPU, the rest on the CPU.
  go.merge = cfg.kv_store() == "device" || cfg.kv_store() == "dist_device_sync"
                 ? MergeDevice::kDevice
                 : MergeDevice::kLocal;
  go.seed = cfg.seed() + 1;
  if (cfg.kv_store() == "device") {
    // MXNet's device kvstore quantizes each device's gradient before the merge;
    // the dist kvstores compress the push instead (the ParamSync's client).
    ASSIGN_OR_RETURN(go.compression, ParseGradientCompression(cfg.gc_type(), cfg.gc_threshold()));
  }
  return go;
}

Status Trainer::InitDevices() {
  ASSIGN_OR_RETURN(DeviceGroupOptions go, TrainingDeviceGroupOptions(cfg_));
  if (env_.adjust_devices) env_.adjust_devices(&go);
  ASSIGN_OR_RETURN(exec_, DeviceGroup::Create(graph_, go));
  params_ = exec_.get();
  const Shape out_shape = exec_->output_shape();
  num_classes_ = static_cast<int>(out_shape.ProductFrom(1));
  output_host_.resize(static_cast<size_t>(out_shape.num_elements()));
  std::string where;
  for (int d = 0; d < exec_->num_devices(); ++d) {
    where +=
        StrCat(d ? "; " : "", exec_->executor(d).backend().Describe(),
               exec_->num_devices() > 1 ? StrCat(" (", exec_->shares()[d], " per batch)") : "");
  }
  env_.log->Info(StrCat("network ", cfg_.network(), ": ", graph_.params().size(),
                        " parameter arrays, ", graph_.NumParams(), " parameters, output ",
                        out_shape.ToString(), ", on ", where));
  return Status::Ok();
}

Status Trainer::InitEmulated() {
  ASSIGN_OR_RETURN(host_params_, HostParams::Create(graph_));
  host_params_->FillGrads();
  params_ = host_params_.get();
  ComputeEmulatorOptions eo;
  eo.seconds = cfg_.emulate_compute() * cfg_.time_dilation();
  ASSIGN_OR_RETURN(emulator_, ComputeEmulator::Create(graph_, eo));
  env_.log->Info(StrCat("network ", cfg_.network(), ": ", graph_.params().size(),
                        " parameter arrays, ", graph_.NumParams(),
                        " parameters, in host memory only (compute is emulated)"));
  const double secs = cfg_.emulate_compute();
  const double fwd = secs * eo.forward_share;
  std::string line = StrCat(
      "compute is emulated (--emulate-compute ", secs,
      "): nothing is computed and no batch is read; each batch waits ", Fixed(secs, 4),
      " s, forward ", Fixed(fwd, 4), " s then backward ", Fixed(secs - fwd, 4), " s, spread over ",
      emulator_->layers().size(), " layers by their share of the model's ",
      emulator_->weighted_by(),
      emulator_->weighted_by() == "flops"
          ? StrCat(" (", Fixed(emulator_->forward_flops() * 1e-6, 1), " MFLOP forward per sample)")
          : std::string(),
      "; each parameter's gradient, a fixed pattern, goes to the kv store when the emulated "
      "backward reaches its layer; no accuracy is measured");
  const double dilation = cfg_.time_dilation();
  if (dilation != 1) {
    line += StrCat("; time dilation ", dilation, ": waits last ", dilation,
                   " times longer and reported times are divided by ", dilation);
  }
  env_.log->Info(line);
  return Status::Ok();
}

Status Trainer::Run() {
  if (cfg_.test_io() != 0) return RunTestIo();
  // The checkpoints' folder, made now as fit.py makes it: a missing one
  // failed the first save, after its epoch had trained.
  if (const std::filesystem::path dir = std::filesystem::path(cfg_.model_prefix()).parent_path();
      !cfg_.model_prefix().empty() && !dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec || !std::filesystem::is_directory(dir)) {
      return Status::IOError(StrCat("--model-prefix ", cfg_.model_prefix(),
                                    ": cannot make its folder ", dir.string(), ": ",
                                    ec ? ec.message() : "a file is in the way"));
    }
  }
  // The reader draws a new order at every Reset: one at each epoch's start,
  // and one more each time an epoch goes round a part shorter than it
  // (NextTrainBatch). A resumed run makes the Resets of the epochs it skips,
  // so it sees the same orders as an unbroken one.
  if (data_.train != nullptr && cfg_.load_epoch() > 0) {
    const int64_t per_pass = std::max<int64_t>(
        1, (data_.train->num_examples() + cfg_.batch_size() - 1) / cfg_.batch_size());
    const int64_t resets_per_epoch = (epoch_size_ + per_pass - 1) / per_pass;
    for (int64_t i = 0; i < cfg_.load_epoch() * resets_per_epoch; ++i) data_.train->Reset();
  }
  for (int epoch = cfg_.load_epoch(); epoch < cfg_.num_epochs(); ++epoch) {
    RETURN_IF_ERROR(TrainEpoch(epoch));
  }
  return Status::Ok();
}

Status Trainer::RunTestIo() {
  data_.train->Reset();
  Batch batch;
  auto start = SteadyClock::now();
  auto tic = start;
  int64_t samples = 0;
  for (int64_t i = 0;; ++i) {
    ASSIGN_OR_RETURN(bool more, data_.train->Next(&batch));
    if (!more) break;
    samples += batch.batch_size();
    if ((i + 1) % cfg_.disp_batches() == 0) {
      const double speed =
          static_cast<double>(cfg_.disp_batches()) * cfg_.batch_size() / SecondsSince(tic);
      env_.log->Info(FormatTestIoLine(i, speed));
      tic = SteadyClock::now();
    }
  }
  const double secs = SecondsSince(start);
  test_io_speed_ = secs > 0 ? samples / secs : 0;
  env_.log->Info(
      StrCat("test-io: ", samples, " images in ", secs, " s: ", test_io_speed_, " images/sec"));
  return Status::Ok();
}

Status Trainer::NextTrainBatch(Batch* batch) {
  ASSIGN_OR_RETURN(bool more, data_.train->Next(batch));
  if (more) return Status::Ok();
  // Fewer batches in this part than epoch_size: go round again (MXNet's ResizeIter).
  data_.train->Reset();
  ASSIGN_OR_RETURN(more, data_.train->Next(batch));
  if (!more) return Status::FailedPrecondition(StrCat(data_.train->Describe(), " is empty"));
  return Status::Ok();
}

Status Trainer::CopyBatchIn(const Batch& batch, const DataIter& from) {
  // A label past the network's classes would train nothing and count as
  // wrong (the softmax has no such output): a wrong --num-classes, say.
  for (size_t i = 0; i < batch.label.size(); ++i) {
    const float v = batch.label[i];
    if (!(v >= 0 && v < static_cast<float>(num_classes_)) || v != std::floor(v)) {
      const size_t e = i / static_cast<size_t>(std::max(1, batch.label_width));
      return Status::InvalidArgument(
          StrCat(from.Describe(), ": example ",
                 e < batch.index.size() ? std::to_string(batch.index[e]) : std::to_string(e),
                 " has label ", v, ", not a class of the network's ", num_classes_,
                 " outputs (--num-classes ", num_classes_, ")"));
    }
  }
  RETURN_IF_ERROR(exec_->LoadData(batch.data.data(), batch.data.size()));
  return exec_->LoadLabel(batch.label.data(), batch.label.size());
}

const float* Trainer::Output() {
  CHECK_OK(exec_->ReadOutput(output_host_.data(), output_host_.size()));
  return output_host_.data();
}

Status Trainer::TrainEpoch(int epoch) {
  env_.log->Info(FormatEpochStartLine(epoch, epoch_size_, cfg_.batch_size(), cfg_.num_epochs()));
  if (emulator_ != nullptr) return TrainEpochEmulated(epoch);
  // Each epoch's dropout masks follow from the seed and the epoch alone, so a
  // resumed run draws the unbroken run's (epoch 0: the executors' own seed).
  exec_->Reseed(static_cast<uint64_t>(cfg_.seed()) + 1 +
                static_cast<uint64_t>(epoch) * 0x9E3779B97F4A7C15ull);
  const auto epoch_start = SteadyClock::now();
  data_.train->Reset();
  ClassificationMetrics metrics(cfg_.top_k());
  // Batch n+1 is read and copied in while batch n's backward runs (on a GPU,
  // which the calls below only enqueue work for), then batch n's output is
  // read for the metrics: the device never waits for the reader.
  Batch batch, next;
  RETURN_IF_ERROR(NextTrainBatch(&batch));
  RETURN_IF_ERROR(CopyBatchIn(batch, *data_.train));
  auto speed_tic = SteadyClock::now();
  MetricValues train_values;
  for (int64_t nbatch = 0; nbatch < epoch_size_; ++nbatch) {
    exec_->Forward(/*is_train=*/true);
    RETURN_IF_ERROR(exec_->TakeError());  // a merge's (a hung device's download)
    RETURN_IF_ERROR(sync_->TakeError());
    exec_->Backward();
    RETURN_IF_ERROR(sync_->TakeError());
    if (nbatch + 1 < epoch_size_) {
      RETURN_IF_ERROR(NextTrainBatch(&next));
      RETURN_IF_ERROR(CopyBatchIn(next, *data_.train));  // the inputs only: the output stays
    }
    metrics.Update(Output(), batch.label.data(), batch.batch_size() - batch.pad, num_classes_);
    std::swap(batch, next);
    // The epoch's Train- values are taken before the Speedometer may reset
    // the metrics on the last batch, as MXNet 1.2 did (before, it printed nan
    // when the last batch was one the Speedometer reported; later versions
    // print the whole epoch's value instead of the last window's).
    if (nbatch + 1 == epoch_size_) train_values = metrics.Get();
    // Speedometer (MXNet v0.10-1.3): starts its clock at the first batch,
    // reports every `disp_batches` batches, then resets the metrics.
    if (nbatch == 0) {
      speed_tic = SteadyClock::now();
    } else if (nbatch % cfg_.disp_batches() == 0) {
      const double speed =
          static_cast<double>(cfg_.disp_batches()) * cfg_.batch_size() / SecondsSince(speed_tic);
      env_.log->Info(FormatSpeedLine(epoch, nbatch, speed, metrics.Get()));
      metrics.Reset();
      speed_tic = SteadyClock::now();
    }
  }
  // The last exchanges of the epoch finish before its time is taken and a
  // checkpoint reads the weights: the device group's merges first (they call
  // the sync), then the sync's exchanges.
  exec_->Drain();
  RETURN_IF_ERROR(exec_->TakeError());
  RETURN_IF_ERROR(sync_->Drain());
  EpochResult result;
  result.epoch = epoch;
  result.train = std::move(train_values);
  result.seconds = SecondsSince(epoch_start);
  result.samples = epoch_size_ * cfg_.batch_size();
  for (const std::string& line : FormatEpochMetricLines(epoch, "Train", result.train)) {
    env_.log->Info(line);
  }
  env_.log->Info(FormatTimeCostLine(epoch, result.seconds));
  for (int d = 0; d < exec_->num_devices(); ++d) {
    const Backend& b = exec_->executor(d).backend();
    if (b.host_accessible()) continue;
    const MemoryStats m = b.memory_stats();
    // (A GPU listed several times has a backend, and a line, per listing.)
    const std::string listing = exec_->num_devices() > 1 ? StrCat(" (listing ", d, ")") : "";
    env_.log->Info(StrCat("Epoch[", epoch, "] ", b.device().ToString(), listing, " memory: peak ",
                          m.peak >> 20, " MiB, in use ", m.in_use >> 20, " MiB, reserved ",
                          m.reserved >> 20, " MiB"));
  }
  // Several devices' BatchNorm statistics made one (their mean) before the
  // checkpoint saves them and validation uses them, as MXNet's fit does.
  RETURN_IF_ERROR(exec_->AverageAux());
  if (!cfg_.model_prefix().empty() && (epoch + 1) % cfg_.save_period() == 0) {
    RETURN_IF_ERROR(SaveCheckpoint(epoch + 1));
  }
  RETURN_IF_ERROR(Validate(epoch, &result));
  history_.push_back(std::move(result));
  return Status::Ok();
}

Status Trainer::TrainEpochEmulated(int epoch) {
  // Reported times are the dilated ones divided by the dilation.
  const double dilation = cfg_.time_dilation();
  const auto epoch_start = SteadyClock::now();
  auto speed_tic = epoch_start;
  for (int64_t nbatch = 0; nbatch < epoch_size_; ++nbatch) {
    emulator_->Step(sync_.get());
    RETURN_IF_ERROR(sync_->TakeError());
    // The Speedometer as in TrainEpoch, without metrics (MXNet prints none then).
    if (nbatch == 0) {
      speed_tic = SteadyClock::now();
    } else if (nbatch % cfg_.disp_batches() == 0) {
      const double speed = static_cast<double>(cfg_.disp_batches()) * cfg_.batch_size() /
                           (SecondsSince(speed_tic) / dilation);
      env_.log->Info(FormatSpeedLine(epoch, nbatch, speed, {}));
      speed_tic = SteadyClock::now();
    }
  }
  RETURN_IF_ERROR(sync_->Drain());
  EpochResult result;
  result.epoch = epoch;
  result.seconds = SecondsSince(epoch_start) / dilation;
  result.samples = epoch_size_ * cfg_.batch_size();
  env_.log->Info(FormatTimeCostLine(epoch, result.seconds));
  // How much of the communication the steps did not hide (undilated seconds).
  const EmulatedStepStats st = emulator_->TakeStats();
  if (st.steps > 0) {
    const double per = dilation * static_cast<double>(st.steps);
    const double step_s = result.seconds / static_cast<double>(st.steps);
    env_.log->Info(StrCat("Epoch[", epoch, "] Emulated step: ", Fixed(step_s, 4), " s, compute ",
                          Fixed(st.compute_s / per, 4), " s, waiting for weights ",
                          Fixed(st.wait_param_s / per, 4), " s (", Fixed(st.wait_first_s / per, 4),
                          " s before the first layer), handing ", "gradients over ",
                          Fixed(st.grad_ready_s / per, 4), " s"));
  }
  history_.push_back(std::move(result));
  return Status::Ok();
}

Status Trainer::Validate(int epoch, EpochResult* result) {
  if (data_.val == nullptr) return Status::Ok();
  data_.val->Reset();
  ClassificationMetrics metrics(cfg_.top_k());
  Batch batch;
  while (true) {
    ASSIGN_OR_RETURN(bool more, data_.val->Next(&batch));
    if (!more) break;
    RETURN_IF_ERROR(CopyBatchIn(batch, *data_.val));
    exec_->Forward(/*is_train=*/false);
    RETURN_IF_ERROR(sync_->TakeError());
    metrics.Update(Output(), batch.label.data(), batch.batch_size() - batch.pad, num_classes_);
  }
  result->val = metrics.Get();
  for (const std::string& line : FormatEpochMetricLines(epoch, "Validation", result->val)) {
    env_.log->Info(line);
  }
  return Status::Ok();
}

std::string Trainer::LoadPrefix(int epoch) const {
  const std::string own = StrCat(cfg_.model_prefix(), "-", env_.rank);
  std::error_code ec;
  if (env_.rank > 0 && std::filesystem::exists(CheckpointParamsPath(own, epoch), ec)) return own;
  return cfg_.model_prefix();
}

Status Trainer::SaveCheckpoint(int epoch_done) {
  // Rank r > 0 saves to prefix-<r>, as fit.py does.
  const std::string prefix =
      env_.rank == 0 ? cfg_.model_prefix() : StrCat(cfg_.model_prefix(), "-", env_.rank);
  std::vector<NamedArray> arrays;
  const auto& params = graph_.params();
  for (int i = 0; i < exec_->num_params(); ++i) {
    NamedArray a;
    a.kind = NamedArray::Kind::kParam;
    a.name = params[i].name;
    a.shape = exec_->param(i).shape().dims();
    a.data.resize(exec_->param(i).num_elements());
    RETURN_IF_ERROR(exec_->ReadParam(i, a.data.data(), a.data.size()));
    arrays.push_back(std::move(a));
  }
  const auto& aux = graph_.aux_states();
  for (int i = 0; i < exec_->num_aux(); ++i) {
    NamedArray a;
    a.kind = NamedArray::Kind::kAux;
    a.name = aux[i].name;
    a.shape = graph_.aux_states()[i].shape.dims();
    a.data.resize(graph_.aux_states()[i].shape.num_elements());
    RETURN_IF_ERROR(exec_->ReadAux(i, a.data.data(), a.data.size()));
    arrays.push_back(std::move(a));
  }
  // The optimizer's state in the same file: one rename commits it all. A
  // .states file of an older run under this prefix would be read with it: it
  // goes first (a crash between leaves no state rather than a wrong one).
  for (NamedArray& a : sync_->SaveState()) arrays.push_back(std::move(a));
  const std::string stale = CheckpointStatesPath(prefix, epoch_done);
  if (std::remove(stale.c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(StrCat("cannot remove the stale ", stale, ": ", std::strerror(errno)));
  }
  const std::string path = CheckpointParamsPath(prefix, epoch_done);
  RETURN_IF_ERROR(SaveArrays(path, arrays));
  env_.log->Info(FormatSavedCheckpointLine(path));
  return Status::Ok();
}

Status Trainer::LoadCheckpoint(int epoch, std::vector<NamedArray>* states) {
  const std::string path = CheckpointParamsPath(LoadPrefix(epoch), epoch);
  ASSIGN_OR_RETURN(std::vector<NamedArray> arrays, LoadArrays(path));
  states->clear();
  for (const NamedArray& a : arrays) {
    if (a.kind == NamedArray::Kind::kOptimizerState) states->push_back(a);
  }
  if (states->empty()) {
    // A checkpoint from before the state moved into the .params.
    const std::string old = CheckpointStatesPath(LoadPrefix(epoch), epoch);
    auto from_file = LoadArrays(old);
    if (from_file.ok()) {
      *states = *std::move(from_file);
    } else if (from_file.status().code() != StatusCode::kNotFound) {
      return from_file.status();
    }
  }
  std::map<std::string, const NamedArray*> by_name;
  for (const NamedArray& a : arrays) by_name[a.name] = &a;
  auto restore = [&](const ParamInfo& info, bool aux, int i) -> Status {
    auto it = by_name.find(info.name);
    if (it == by_name.end()) {
      return Status::InvalidArgument(StrCat(path, " has no array ", info.name));
    }
    if (it->second->shape != info.shape.dims()) {
      return Status::InvalidArgument(StrCat(path, ": ", info.name, " has shape ",
                                            Shape(it->second->shape).ToString(),
                                            ", the network wants ", info.shape.ToString()));
    }
    const auto& d = it->second->data;
    return aux ? exec_->WriteAux(i, d.data(), d.size()) : exec_->WriteParam(i, d.data(), d.size());
  };
  for (int i = 0; i < exec_->num_params(); ++i) {
    RETURN_IF_ERROR(restore(graph_.params()[i], false, i));
  }
  for (int i = 0; i < exec_->num_aux(); ++i) {
    RETURN_IF_ERROR(restore(graph_.aux_states()[i], true, i));
  }
  env_.log->Info(StrCat("Loaded parameters from \"", path, "\""));
  return Status::Ok();
}

}  // namespace pstrain
