#include "worker/param_sync.h"

#include <algorithm>
#include <cstring>
#include <map>

namespace pstrain {
namespace {

// The name of the array that says which optimizer wrote a checkpoint's
// state, followed by Optimizer::SlotLayoutName().
constexpr char kOptimizerMarker[] = "__optimizer_";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Optimizer::ApplyStep over n floats, split over the OpenMP team when it is
// large (more than one piece per two threads' worth): the rule is element by
// element, so the result is the one pass's, bit for bit. A GPU worker's host
// merge updates all of ResNet-50 (25.5M floats, about 0.5 GB of memory
// traffic with momentum) here every step. `state`: the step's slots (n floats
// each, back to back), or null.
UpdateCheck ApplyStepThreaded(const Optimizer::Step& s, const float* grad, float* weight,
                              float* state, size_t n) {
  constexpr size_t kPiece = size_t{1} << 18;  // floats: 1 MiB
  if (n < 2 * kPiece) return Optimizer::ApplyStep(s, grad, weight, weight, state, n, n);
  const int64_t pieces = static_cast<int64_t>((n + kPiece - 1) / kPiece);
  std::vector<UpdateCheck> checks(static_cast<size_t>(pieces));
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < pieces; ++p) {
    const size_t off = static_cast<size_t>(p) * kPiece;
    checks[static_cast<size_t>(p)] = Optimizer::ApplyStep(s, grad + off, weight + off, weight + off,
                                                          state == nullptr ? nullptr : state + off,
                                                          n, std::min(kPiece, n - off));
  }
  UpdateCheck all;
  for (const UpdateCheck& c : checks) {
    if (c.bad_grad >= 0) all.bad_grad = 0;
    all.bad_weight = all.bad_weight || c.bad_weight;
  }
  return all;
}

}  // namespace

float WeightDecayMult(const std::string& param_name) {
  return EndsWith(param_name, "_weight") || EndsWith(param_name, "_gamma") ? 1.0f : 0.0f;
}

StatusOr<std::unique_ptr<LocalParamSync>> LocalParamSync::Create(const OptimizerConfig& cfg) {
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, Optimizer::Create(cfg));
  return std::unique_ptr<LocalParamSync>(new LocalParamSync(std::move(opt)));
}

Status LocalParamSync::Init(ModelParams* exec) {
  exec_ = exec;
  const auto& params = exec->graph().params();
  states_.assign(params.size(), ParamState{});
  device_state_.assign(params.size(), Tensor());
  for (size_t i = 0; i < params.size(); ++i) states_[i].wd_mult = WeightDecayMult(params[i].name);
  const int slots = optimizer_->num_slots();
  if (slots == 0 || params.empty() || exec->host_param(0) != nullptr) return Status::Ok();
  // The state of parameters in device memory stays there: allocated now, in
  // one buffer, so that a device too small for it says so before training
  // rather than failing at the first update. Per parameter, its slots back to
  // back.
  std::vector<Shape> shapes;
  for (int p = 0; p < exec->num_params(); ++p) {
    shapes.push_back(Shape({slots * exec->param(p).num_elements()}));
  }
  // (The allocation's error names the bytes.)
  StatusOr<std::vector<Tensor>> state = exec->backend().TryZerosPacked(shapes);
  if (!state.ok()) {
    return state.status().WithContext(StrCat("the optimizer's state (", slots, " per weight) on ",
                                             exec->backend().device().ToString()));
  }
  device_state_ = std::move(state).value();
  return Status::Ok();
}

void LocalParamSync::OnGradReady(int i) {
  float* w = exec_->host_param(i);
  if (w != nullptr) {
    // Optimizer::Update's steps, with the pass over the floats threaded.
    const size_t n = static_cast<size_t>(exec_->param(i).num_elements());
    ParamState& state = states_[i];
    const Optimizer::Step step = optimizer_->NextStep(&state);
    const size_t want = static_cast<size_t>(step.num_slots()) * n;
    if (state.slots.size() != want) state.slots.assign(want, 0.0f);
    const UpdateCheck c = ApplyStepThreaded(step, exec_->host_grad(i), w,
                                            state.slots.empty() ? nullptr : state.slots.data(), n);
    if (!c.ok()) NoteNonFinite(i, c.bad_grad >= 0);
    return;
  }
  Optimizer::Step step = optimizer_->NextStep(&states_[i]);
  step.param = i;  // what the backend's check names (TakeError)
  exec_->backend().ApplyOptimizerStep(step, exec_->grad(i), exec_->param(i), device_state_[i]);
  device_updates_.store(true, std::memory_order_relaxed);
}

void LocalParamSync::NoteNonFinite(int i, bool bad_grad) {
  MutexLock l(&mu_);
  if (!error_.ok()) return;
  const std::string& name = exec_->graph().params()[i].name;
  error_ = Status::FailedPrecondition(
      bad_grad ? StrCat("the gradient of ", name, " holds NaN or Inf at update ",
                        states_[i].num_updates, ": training stops (the model would be broken)")
               : StrCat("update ", states_[i].num_updates, " made ", name,
                        " NaN or Inf although its gradient was finite: the learning rate is too "
                        "large (lower --lr, or clip with --clip-gradient)"));
}

void LocalParamSync::TakeDeviceCheck() {
  if (!device_updates_.load(std::memory_order_relaxed)) return;
  const StepCheck c = exec_->backend().TakeStepCheck();
  // The gradient first, as the host's check words it. (An update number read
  // here is the parameter's count now: the update found, in the step loop,
  // whose output read waited for the device.)
  const int num_params = static_cast<int>(states_.size());
  auto known = [num_params](int p) { return p >= 0 && p < num_params; };
  const bool bad = c.bad_grad || c.bad_weight;
  const int p = c.bad_grad ? c.grad_param : c.weight_param;
  if (bad && known(p)) {
    NoteNonFinite(p, /*bad_grad=*/c.bad_grad);
  } else if (bad) {
    // The backend's check is shared by whatever updates on it; one that named
    // no parameter of this model.
    MutexLock l(&mu_);
    if (error_.ok()) {
      error_ = Status::FailedPrecondition(
          StrCat("a device update (parameter number ", p, ") ",
                 c.bad_grad ? "had a NaN or Inf gradient" : "made its weights NaN or Inf",
                 ": training stops"));
    }
  }
}

Status LocalParamSync::TakeError() {
  TakeDeviceCheck();
  MutexLock l(&mu_);
  Status s = error_;
  error_ = Status::Ok();
  return s;
}

Status LocalParamSync::Drain() {
  // Every update asked so far finished, so the check sees them all.
  if (device_updates_.load(std::memory_order_relaxed)) exec_->backend().Synchronize();
  return TakeError();
}

std::vector<NamedArray> LocalParamSync::SaveState() const {
  std::vector<NamedArray> out;
  const auto& params = exec_->graph().params();
  const std::vector<std::string> names = optimizer_->SlotNames();
  const bool counts = optimizer_->reads_update_count();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<float> slots;
    if (device_state_[i].defined()) {
      slots.resize(static_cast<size_t>(device_state_[i].num_elements()));
      exec_->backend().CopyToHost(device_state_[i], slots.data());
    } else {
      slots = states_[i].slots;
    }
    if (slots.empty()) continue;
    const int64_t total = states_[i].earlier_updates + states_[i].num_updates;
    const size_t n = slots.size() / names.size();
    for (size_t j = 0; j < names.size(); ++j) {
      NamedArray a;
      a.kind = NamedArray::Kind::kOptimizerState;
      a.name = params[i].name + "_" + names[j];
      a.shape = {static_cast<int64_t>(n)};
      a.data.assign(slots.begin() + static_cast<ptrdiff_t>(j * n),
                    slots.begin() + static_cast<ptrdiff_t>((j + 1) * n));
      out.push_back(std::move(a));
    }
    if (counts) {
      // ADAM's bias correction reads the count. A float holds it exactly up
      // to 2^24 updates; past that, both corrections are 1 to a float.
      NamedArray a;
      a.kind = NamedArray::Kind::kOptimizerState;
      a.name = params[i].name + "_updates";
      a.shape = {1};
      a.data = {static_cast<float>(total)};
      out.push_back(std::move(a));
    }
  }
  if (!out.empty()) {
    // Which optimizer wrote them: a resume under another one is refused
    // (SGD's and NAG's arrays share their names; RMSProp's plain and
    // centered ones their first).
    NamedArray a;
    a.kind = NamedArray::Kind::kOptimizerState;
    a.name = kOptimizerMarker + optimizer_->SlotLayoutName();
    a.shape = {1};
    a.data = {static_cast<float>(names.size())};
    out.push_back(std::move(a));
  }
  return out;
}

Status LocalParamSync::LoadState(const std::vector<NamedArray>& arrays) {
  // name -> (parameter, slot); slot -1: the update count.
  std::map<std::string, std::pair<int, int>> index;
  const auto& params = exec_->graph().params();
  const std::vector<std::string> names = optimizer_->SlotNames();
  const int slots = static_cast<int>(names.size());
  for (size_t i = 0; i < params.size(); ++i) {
    for (int j = 0; j < slots; ++j) index[params[i].name + "_" + names[j]] = {int(i), j};
    if (optimizer_->reads_update_count()) {
      index[params[i].name + "_updates"] = {int(i), -1};
    }
  }
  const std::string ours = optimizer_->SlotLayoutName();
  for (const NamedArray& a : arrays) {
    if (a.kind != NamedArray::Kind::kOptimizerState || a.name.rfind(kOptimizerMarker, 0) != 0) {
      continue;
    }
    const std::string theirs = a.name.substr(std::strlen(kOptimizerMarker));
    if (theirs != ours) {
      return Status::InvalidArgument(
          StrCat("the optimizer state was written by ", theirs, ", and this run's optimizer is ",
                 ours, ": resume with the --optimizer (and --mom) it was written with"));
    }
  }
  std::vector<std::vector<float>> loaded(params.size());
  std::vector<std::vector<bool>> have(params.size(), std::vector<bool>(names.size() + 1, false));
  for (const NamedArray& a : arrays) {
    if (a.kind != NamedArray::Kind::kOptimizerState || a.name.rfind(kOptimizerMarker, 0) == 0) {
      continue;
    }
    auto it = index.find(a.name);
    if (it == index.end()) {
      std::string known;
      for (const std::string& s : names) known += (known.empty() ? "_" : ", _") + s;
      return Status::InvalidArgument(
          StrCat("optimizer state ", a.name, " matches no parameter's state under ",
                 Optimizer::TypeName(optimizer_->config().type()), " (whose arrays are <param>",
                 known.empty() ? std::string(": none") : known,
                 "): was the checkpoint written with another --optimizer or --mom?"));
    }
    const auto [i, j] = it->second;
    have[i][j < 0 ? names.size() : static_cast<size_t>(j)] = true;
    if (j < 0) {
      // (A float holds every count exactly up to 2^24; past that, Adam's
      // corrections are 1 to a float.)
      if (a.data.size() != 1 || !(a.data[0] >= 0 && a.data[0] <= 9.0e15f)) {
        return Status::InvalidArgument(
            StrCat("optimizer state ", a.name, " must be one finite count >= 0"));
      }
      states_[i].earlier_updates = static_cast<int64_t>(a.data[0]);
      continue;
    }
    const int64_t n = exec_->param(i).num_elements();
    if (static_cast<int64_t>(a.data.size()) != n) {
      return Status::InvalidArgument(
          StrCat("optimizer state ", a.name, " has ", a.data.size(), " values, parameter has ", n));
    }
    std::vector<float>& all = loaded[i];
    if (all.empty()) all.assign(static_cast<size_t>(slots * n), 0.0f);
    std::copy(a.data.begin(), a.data.end(), all.begin() + j * n);
  }
  // A parameter's state is whole or absent: a missing array would restart
  // part of it from zero without a word.
  const bool counts = optimizer_->reads_update_count();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::vector<bool>& h = have[i];
    if (std::find(h.begin(), h.end(), true) == h.end()) continue;
    for (size_t j = 0; j <= names.size(); ++j) {
      if (h[j] || (j == names.size() && !counts)) continue;
      const std::string missing =
          params[i].name + "_" + (j < names.size() ? names[j] : std::string("updates"));
      return Status::InvalidArgument(StrCat("the optimizer state of ", params[i].name, " lacks ",
                                            missing, " (", ours, " keeps all of its arrays)"));
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (loaded[i].empty()) continue;
    if (exec_->host_param(static_cast<int>(i)) != nullptr) {
      states_[i].slots = std::move(loaded[i]);
    } else if (device_state_[i].defined()) {
      exec_->backend().CopyFromHost(loaded[i].data(), device_state_[i]);
    }
  }
  return Status::Ok();
}

}  // namespace pstrain
