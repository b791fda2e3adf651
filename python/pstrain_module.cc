// _pstrain: the C++ half of the `pstrain` Python package (python/pstrain/).
//
// It binds what the C++ tools use, no second copy: the role a process plays
// (tools/cluster_role.h: scheduler and servers run to the job's end), the
// worker's ClusterNode + KVClient (worker/kv_client.h) and the optimizer of
// nn/optimizer.h (for the `local` store). The Python half turns NumPy arrays
// and PyTorch tensors into the flat float32 buffers this module takes, keeps
// them alive while a request is in flight and maps keys.
//
// Threads and the GIL: every call that can wait (start, configuration,
// barriers, Wait, Finish) releases the GIL; the KV client's callbacks run on
// its own threads and only mark a Completion done (no Python there). Errors
// are raised as pstrain.Error (a RuntimeError) carrying the Status text.
#include <glog/logging.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "common/deadline.h"
#include "common/env.h"
#include "common/gradient_compression.h"
#include "common/mutex.h"
#include "common/status.h"
#include "net/cluster_node.h"
#include "nn/optimizer.h"
#include "proto/ps.pb.h"
#include "tools/cluster_role.h"
#include "worker/kv_client.h"

namespace py = pybind11;

namespace pstrain {
namespace {

// The C++ side of pstrain.Error; pybind11 translates it.
class PyError : public std::runtime_error {
 public:
  explicit PyError(const Status& s) : std::runtime_error(s.ToString()) {}
};

void ThrowIfError(const Status& s) {
  if (!s.ok()) throw PyError(s);
}

// One request's end: set once by the KV client's callback (any thread, no
// GIL), read by the Python handle. Thread-safe.
class Completion {
 public:
  // The first call wins.
  void Done(const Status& s) {
    MutexLock l(&mu_);
    if (done_) return;
    status_ = s;
    done_ = true;
    done_at_ = SteadyClock::now();
    cv_.SignalAll();
  }
  bool done() const {
    MutexLock l(&mu_);
    return done_;
  }
  // When it was done, in seconds on the steady clock (Linux: CLOCK_MONOTONIC,
  // Python's time.monotonic() and time.perf_counter()); NaN until done.
  double done_at() const {
    MutexLock l(&mu_);
    if (!done_) return std::numeric_limits<double>::quiet_NaN();
    return std::chrono::duration<double>(done_at_.time_since_epoch()).count();
  }
  // The request's status once done; nullopt if `deadline` passes first (read
  // together with `done`: a request ending just after the wait gave up is
  // not taken for one that timed out).
  std::optional<Status> Wait(Deadline deadline) {
    MutexLock l(&mu_);
    if (!cv_.WaitUntil(deadline, [&]() REQUIRES(mu_) { return done_; })) return std::nullopt;
    return status_;
  }

 private:
  mutable Mutex mu_;
  CondVar cv_{&mu_};
  bool done_ GUARDED_BY(mu_) = false;
  SteadyClock::time_point done_at_ GUARDED_BY(mu_);
  Status status_ GUARDED_BY(mu_);
};

// Waits for `c` until `timeout_ms` (< 0: forever) with the GIL released,
// looking for Ctrl-C (Python's signal handlers) every 200 ms.
void WaitCompletion(Completion* c, int64_t timeout_ms) {
  const Deadline end = timeout_ms < 0 ? Deadline::Never() : Deadline::InMillis(timeout_ms);
  for (;;) {
    std::optional<Status> s;
    {
      py::gil_scoped_release release;
      s = c->Wait(end.Min(Deadline::InMillis(200)));
    }
    if (s.has_value()) {
      ThrowIfError(*s);
      return;
    }
    if (end.Expired()) {
      ThrowIfError(Status::DeadlineExceeded(StrCat("request not done within ", timeout_ms, " ms")));
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

// A float32 buffer of exactly `count` elements, C-contiguous; its address
// while the caller keeps `obj` alive. `what` names it in errors.
float* FloatBuffer(const py::buffer& obj, int64_t count, bool writable, const char* what) {
  py::buffer_info info = obj.request(writable);
  if (info.itemsize != 4 || (info.format != "f" && info.format != "<f" && info.format != "=f")) {
    throw py::type_error(StrCat(what, ": expected float32 values, got format '", info.format,
                                "' of ", info.itemsize, " bytes"));
  }
  int64_t stride = 4;
  for (int d = static_cast<int>(info.ndim) - 1; d >= 0; --d) {
    if (info.shape[d] != 1 && info.strides[d] != stride) {
      throw py::value_error(StrCat(what, ": the buffer is not C-contiguous"));
    }
    stride *= info.shape[d];
  }
  if (info.size != count) {
    throw py::value_error(
        StrCat(what, ": ", info.size, " elements, but the keys' lengths add up to ", count));
  }
  return static_cast<float*>(info.ptr);
}

int64_t Total(const std::vector<int64_t>& lens) {
  int64_t n = 0;
  for (int64_t l : lens) {
    if (l <= 0) throw py::value_error(StrCat("a key's length must be positive, got ", l));
    n += l;
  }
  return n;
}

float GetFloat(const py::dict& d, const char* name, float fallback) {
  return d.contains(name) ? d[name].cast<float>() : fallback;
}

// An OptimizerConfig from the dict pstrain.optimizer builds (its names are
// MXNet's): type "sgd" | "nag" | "adam" | "rmsprop" | "adagrad" | "test",
// learning_rate, momentum (sgd, nag), wd, rescale_grad, clip_gradient (None
// or <= 0: off), beta1, beta2 (adam), epsilon (adam, rmsprop, adagrad; None:
// the type's default), gamma1, gamma2, centered, clip_weights (rmsprop),
// lr_scheduler {type "factor" | "multifactor", step, factor, stop_factor_lr}.
OptimizerConfig OptimizerFromDict(const py::dict& d) {
  OptimizerConfig c;
  const std::string type = d.contains("type") ? d["type"].cast<std::string>() : "sgd";
  OptimizerConfig::Type t;
  if (!OptimizerTypeFromName(type, &t)) {
    throw py::value_error(StrCat("optimizer type '", type, "': the servers run ", kOptimizerNames));
  }
  c.set_type(t);
  c.set_learning_rate(GetFloat(d, "learning_rate", c.learning_rate()));
  c.set_momentum(GetFloat(d, "momentum", c.momentum()));
  c.set_wd(GetFloat(d, "wd", c.wd()));
  c.set_rescale_grad(GetFloat(d, "rescale_grad", c.rescale_grad()));
  if (d.contains("clip_gradient") && !d["clip_gradient"].is_none()) {
    c.set_clip_gradient(d["clip_gradient"].cast<float>());
  }
  if (d.contains("beta1")) c.set_beta1(d["beta1"].cast<double>());
  if (d.contains("beta2")) c.set_beta2(d["beta2"].cast<double>());
  if (d.contains("epsilon") && !d["epsilon"].is_none()) {
    c.set_epsilon(d["epsilon"].cast<float>());
  }
  c.set_gamma1(GetFloat(d, "gamma1", c.gamma1()));
  c.set_gamma2(GetFloat(d, "gamma2", c.gamma2()));
  if (d.contains("centered")) c.set_centered(d["centered"].cast<bool>());
  if (d.contains("clip_weights") && !d["clip_weights"].is_none()) {
    c.set_clip_weights(d["clip_weights"].cast<float>());
  }
  if (d.contains("lr_scheduler") && !d["lr_scheduler"].is_none()) {
    const py::dict s = d["lr_scheduler"].cast<py::dict>();
    LrSchedulerConfig* sc = c.mutable_lr_scheduler();
    const std::string st = s.contains("type") ? s["type"].cast<std::string>() : "";
    if (st == "factor") {
      sc->set_type(LrSchedulerConfig::FACTOR);
      sc->set_step(s["step"].cast<int64_t>());
    } else if (st == "multifactor") {
      sc->set_type(LrSchedulerConfig::MULTI_FACTOR);
      for (int64_t step : s["step"].cast<std::vector<int64_t>>()) sc->add_steps(step);
    } else {
      throw py::value_error(
          StrCat("lr_scheduler type '", st, "': the servers run factor or multifactor"));
    }
    sc->set_factor(GetFloat(s, "factor", 1.0f));
    sc->set_stop_factor_lr(GetFloat(s, "stop_factor_lr", sc->stop_factor_lr()));
  }
  // The same checks the servers make, here, so a bad value is raised at once.
  ThrowIfError(Optimizer::Create(c).status());
  return c;
}

// The names of the per-key state arrays the optimizer `d` (OptimizerFromDict's
// form) keeps, in the order its state holds them (Optimizer::SlotNames: "mean",
// "var" for adam, none for sgd without momentum). Raises as set_optimizer
// would for a setting the servers refuse.
std::vector<std::string> OptimizerSlots(const py::dict& d) {
  auto opt = Optimizer::Create(OptimizerFromDict(d));
  ThrowIfError(opt.status());
  return (*opt)->SlotNames();
}

// A worker of a dist job: its ClusterNode and KVClient, from DMLC_*.
// Thread-safe: any thread may call any method. Close() is idempotent; a call
// from another thread still in flight when it comes ends first (the node and
// the client live until then), and calls after it raise "closed".
class Client {
 public:
  // Reads the job's environment, registers with the scheduler and connects to
  // the servers. REQUIRES: DMLC_ROLE says worker (or is unset).
  Client() {
    auto env = ReadClusterEnv();
    ThrowIfError(env.status());
    if (env->role != Role::kWorker) {
      ThrowIfError(Status::FailedPrecondition(
          StrCat("DMLC_ROLE is ", RoleName(env->role), ": only a worker opens a KVStore")));
    }
    env_ = *env;
    auto node = ClusterNode::Create(ClusterOptionsFromJobEnv(env_));
    ThrowIfError(node.status());
    node_ = std::move(node).value();
    kv_ = std::make_unique<KVClient>(node_.get(), KVClientOptionsFromJobEnv(env_));
    Status s;
    {
      py::gil_scoped_release release;
      s = kv_->Start();
    }
    if (!s.ok()) {
      Abandon(s);
      ThrowIfError(s);
    }
  }
  // No call is in flight: pybind11 holds a reference to the object during one.
  ~Client() {
    py::gil_scoped_release release;
    MutexLock l(&mu_);
    kv_.reset();
    node_.reset();
    Cancel();
  }

  int rank() const {
    MutexLock l(&mu_);
    return kv_ ? kv_->rank() : 0;
  }
  int num_workers() const { return env_.num_workers; }
  int num_servers() const { return env_.num_servers; }
  int request_timeout_ms() const { return env_.request_timeout_ms; }

  // Installs `sync` mode and the optimizer (None: none; in dist_sync the
  // servers then keep the sum of the pushes) on every server; `generation`
  // as ServerConfig says. Blocks until every server took it.
  // gc_threshold: None, or the threshold of 2-bit gradient compression.
  // wd_mult, lr_mult: per key, multipliers of the optimizer's (absent: 1).
  void Configure(bool sync, const py::object& optimizer, uint32_t generation,
                 const std::map<uint64_t, float>& wd_mult, std::optional<float> gc_threshold,
                 const std::map<uint64_t, float>& lr_mult) {
    ServerConfig cfg;
    cfg.set_sync_mode(sync);
    cfg.set_generation(generation);
    if (!optimizer.is_none()) *cfg.mutable_optimizer() = OptimizerFromDict(optimizer);
    for (const auto& [key, mult] : wd_mult) (*cfg.mutable_wd_mult())[key] = mult;
    for (const auto& [key, mult] : lr_mult) (*cfg.mutable_lr_mult())[key] = mult;
    if (gc_threshold) {
      ThrowIfError(ParseGradientCompression("2bit", *gc_threshold).status());
      cfg.mutable_gradient_compression()->set_type(GradientCompressionConfig::TWO_BIT);
      cfg.mutable_gradient_compression()->set_threshold(*gc_threshold);
    }
    Lease lease(this);
    Status s;
    {
      py::gil_scoped_release release;
      s = lease.kv()->SetServerConfig(cfg, Deadline::InMillis(env_.request_timeout_ms));
    }
    ThrowIfError(s.WithContext("configuring the servers"));
  }

  std::shared_ptr<Completion> Init(const std::vector<uint64_t>& keys,
                                   const std::vector<int64_t>& lens, const py::buffer& vals) {
    Check(keys, lens);
    const float* v = FloatBuffer(vals, Total(lens), false, "init value");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->Init(keys, lens, v, std::move(cb));
    });
  }
  std::shared_ptr<Completion> Replace(const std::vector<uint64_t>& keys,
                                      const std::vector<int64_t>& lens, const py::buffer& vals) {
    Check(keys, lens);
    const float* v = FloatBuffer(vals, Total(lens), false, "replace value");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->Replace(keys, lens, v, std::move(cb));
    });
  }
  std::shared_ptr<Completion> Push(const std::vector<uint64_t>& keys,
                                   const std::vector<int64_t>& lens, const py::buffer& vals,
                                   int priority) {
    Check(keys, lens);
    const float* v = FloatBuffer(vals, Total(lens), false, "push value");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->Push(keys, lens, v, priority, std::move(cb));
    });
  }
  std::shared_ptr<Completion> Pull(const std::vector<uint64_t>& keys,
                                   const std::vector<int64_t>& lens, const py::buffer& out,
                                   int priority) {
    Check(keys, lens);
    float* o = FloatBuffer(out, Total(lens), true, "pull output");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->Pull(keys, lens, o, priority, std::move(cb));
    });
  }
  std::shared_ptr<Completion> PushPull(const std::vector<uint64_t>& keys,
                                       const std::vector<int64_t>& lens, const py::buffer& vals,
                                       const py::buffer& out, int priority) {
    Check(keys, lens);
    const int64_t n = Total(lens);
    const float* v = FloatBuffer(vals, n, false, "pushpull value");
    float* o = FloatBuffer(out, n, true, "pushpull output");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->PushPull(keys, lens, v, o, priority, std::move(cb));
    });
  }

  std::shared_ptr<Completion> AllReduce(const std::vector<uint64_t>& keys,
                                        const std::vector<int64_t>& lens, const py::buffer& vals,
                                        const py::buffer& out, int priority) {
    Check(keys, lens);
    const int64_t n = Total(lens);
    const float* v = FloatBuffer(vals, n, false, "allreduce value");
    float* o = FloatBuffer(out, n, true, "allreduce output");
    return Issue([&](KVClient* kv, KVClient::Callback cb) {
      return kv->AllReduce(keys, lens, v, o, priority, std::move(cb));
    });
  }

  void Barrier() {
    Lease lease(this);
    Status s;
    {
      py::gil_scoped_release release;
      s = lease.kv()->Barrier(Deadline::InMillis(env_.barrier_timeout_ms));
    }
    ThrowIfError(s.WithContext("worker barrier"));
  }

  // Ends this worker's part in the job. `error` empty: tells the scheduler it
  // is done and waits for the job's end (REQUIRES: every request completed);
  // otherwise reports the error, which stops the job. Then stops the node.
  // A second Close() (another thread's) returns once the first is done.
  void Close(const std::string& error) {
    Status s;
    {
      py::gil_scoped_release release;
      KVClient* kv;
      ClusterNode* node;
      {
        MutexLock l(&mu_);
        if (closing_) {
          // Bounded: the first Close() is bounded by the deadlines below.
          idle_cv_.WaitUntil(Deadline::Never(), [&]() REQUIRES(mu_) { return kv_ == nullptr; });
          return;
        }
        if (!kv_) return;
        closing_ = true;
        kv = kv_.get();
        node = node_.get();
      }
      // No new call starts now; those in flight may still use kv and node.
      if (error.empty()) {
        s = kv->Finish(Deadline::InMillis(env_.barrier_timeout_ms));
        if (!s.ok()) node->Fail(s);
      } else {
        node->Fail(Status::Internal(error));
      }
      MutexLock l(&mu_);
      // A call in flight ends within its own deadline (the failed node ends
      // barriers at once); past that the node and the client are left alive
      // rather than destroyed under it.
      // (In 64 bits: a timeout of INT32_MAX, a natural "never", overflowed.)
      const Deadline end = Deadline::InMillis(
          int64_t{std::max(env_.barrier_timeout_ms, env_.request_timeout_ms)} + 10000);
      if (idle_cv_.WaitUntil(end, [&]() REQUIRES(mu_) { return active_ == 0; })) {
        kv_.reset();
        node_.reset();
      } else {
        LOG(ERROR) << "closing the KVStore: " << active_
                   << " call(s) on other threads did not end; the client is left running";
        (void)kv_.release();
        (void)node_.release();
        if (s.ok()) s = Status::DeadlineExceeded("calls on other threads did not end");
      }
      Cancel();
      idle_cv_.SignalAll();
    }
    ThrowIfError(s.WithContext("finishing the job"));
  }
  bool closed() const {
    MutexLock l(&mu_);
    return closing_ || !kv_;
  }

 private:
  // Keeps kv_ and node_ alive for one call (Close() waits for it); raises
  // FailedPrecondition if the store is closed or closing.
  class Lease {
   public:
    explicit Lease(Client* c) : c_(c) {
      MutexLock l(&c->mu_);
      if (c->closing_ || !c->kv_)
        throw PyError(Status::FailedPrecondition("the KVStore is closed"));
      ++c->active_;
      kv_ = c->kv_.get();
    }
    ~Lease() {
      MutexLock l(&c_->mu_);
      if (--c_->active_ == 0) c_->idle_cv_.SignalAll();
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    KVClient* kv() const { return kv_; }

   private:
    Client* const c_;
    KVClient* kv_;
  };

  void Check(const std::vector<uint64_t>& keys, const std::vector<int64_t>& lens) {
    if (keys.empty() || keys.size() != lens.size()) {
      throw py::value_error(StrCat("expected as many keys as lengths (and at least one), got ",
                                   keys.size(), " keys and ", lens.size(), " lengths"));
    }
  }
  // Issues one request whose end marks a new Completion.
  template <typename Fn>
  std::shared_ptr<Completion> Issue(Fn issue) {
    Lease lease(this);
    auto c = std::make_shared<Completion>();
    {
      MutexLock l(&mu_);  // not held while issuing (the callback may run at once)
      if (issued_.size() >= 2 * pruned_size_ + 64) {
        issued_.erase(std::remove_if(issued_.begin(), issued_.end(),
                                     [](const std::weak_ptr<Completion>& w) {
                                       auto p = w.lock();
                                       return p == nullptr || p->done();
                                     }),
                      issued_.end());
        pruned_size_ = issued_.size();
      }
      issued_.push_back(c);
    }
    {
      py::gil_scoped_release release;
      issue(lease.kv(), [c](const Status& s) { c->Done(s); });
    }
    return c;
  }
  void Abandon(const Status& s) {
    py::gil_scoped_release release;
    MutexLock l(&mu_);
    node_->Fail(s);
    kv_.reset();
    node_.reset();
  }
  // Once the client is gone no callback runs: requests still open end here.
  void Cancel() REQUIRES(mu_) {
    for (const auto& w : issued_) {
      if (auto c = w.lock()) c->Done(Status::Cancelled("the KVStore was closed"));
    }
    issued_.clear();
  }

  JobEnv env_;  // set by the constructor, then read-only
  mutable Mutex mu_;
  CondVar idle_cv_{&mu_};  // active_ fell to 0, or a Close() ended
  std::unique_ptr<ClusterNode> node_ GUARDED_BY(mu_);
  std::unique_ptr<KVClient> kv_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;  // Close() began: no new call starts
  int active_ GUARDED_BY(mu_) = 0;        // calls in flight using kv_ (Leases)
  // Requests issued (pruned of finished ones as it grows).
  std::vector<std::weak_ptr<Completion>> issued_ GUARDED_BY(mu_);
  size_t pruned_size_ GUARDED_BY(mu_) = 0;
};

// The optimizer of a `local` store: nn/optimizer.h with one state per key.
// Not thread-safe (the Python store serializes its calls).
class LocalUpdater {
 public:
  // lr_mult, wd_mult: per key, multipliers of the optimizer's (absent: 1),
  // applied at every update as the servers apply ServerConfig's.
  LocalUpdater(const py::dict& optimizer, std::map<uint64_t, float> lr_mult,
               std::map<uint64_t, float> wd_mult)
      : cfg_(OptimizerFromDict(optimizer)),
        lr_mult_(std::move(lr_mult)),
        wd_mult_(std::move(wd_mult)) {
    for (const auto* mults : {&lr_mult_, &wd_mult_}) {
      for (const auto& [key, mult] : *mults) {
        if (!std::isfinite(mult)) {
          throw py::value_error(StrCat(mults == &lr_mult_ ? "lr_mult" : "wd_mult", " of key ", key,
                                       " is ", mult, ": a multiplier must be finite"));
        }
      }
    }
    auto opt = Optimizer::Create(cfg_);
    ThrowIfError(opt.status());
    opt_ = std::move(opt).value();
  }
  // weight <- update(grad, weight) for `key` (float32 buffers of equal size).
  // A gradient holding NaN or Inf is refused before it touches the weights.
  void Update(uint64_t key, const py::buffer& grad, const py::buffer& weight) {
    py::buffer_info w = weight.request(true);
    float* wp = FloatBuffer(weight, w.size, true, "weight");
    const float* gp = FloatBuffer(grad, w.size, false, "gradient");
    const size_t n = static_cast<size_t>(w.size);
    if (!AllFinite(gp, n)) {
      ThrowIfError(Status::FailedPrecondition(
          StrCat("local update of key ", key,
                 ": the gradient holds NaN or Inf (the weights were left "
                 "as they were)")));
    }
    ParamState& state = states_[key];
    auto lr = lr_mult_.find(key);
    state.lr_mult = lr == lr_mult_.end() ? 1.0f : lr->second;
    auto wd = wd_mult_.find(key);
    state.wd_mult = wd == wd_mult_.end() ? 1.0f : wd->second;
    const UpdateCheck check = opt_->Update(gp, wp, n, &state);
    if (!check.ok()) {
      ThrowIfError(
          Status::FailedPrecondition(StrCat("local update of key ", key,
                                            ": the weights became NaN or Inf (learning rate too "
                                            "large?)")));
    }
  }

  // One key's state: (key, updates, lr_mult, wd_mult, the optimizer's slots
  // as float32 bytes: Optimizer::SlotNames' arrays back to back).
  using KeyState = std::tuple<uint64_t, int64_t, float, float, py::bytes>;

  // The optimizer's update count (its schedule's clock) and every key's state.
  std::pair<int64_t, std::vector<KeyState>> GetStates() const {
    std::vector<KeyState> out;
    for (const auto& [key, st] : states_) {
      out.emplace_back(key, st.num_updates, st.lr_mult, st.wd_mult,
                       py::bytes(reinterpret_cast<const char*>(st.slots.data()),
                                 st.slots.size() * sizeof(float)));
    }
    return {opt_->num_update(), std::move(out)};
  }

  // Replaces every key's state with `states` (GetStates' form) and moves the
  // update count on to `num_update`.
  void SetStates(int64_t num_update, const std::vector<KeyState>& states) {
    if (num_update < 0) throw py::value_error(StrCat("update count ", num_update, " < 0"));
    std::unordered_map<uint64_t, ParamState> next;
    for (const auto& [key, updates, lr_mult, wd_mult, slots] : states) {
      const std::string_view bytes = std::string_view(slots);
      if (updates < 0 || bytes.size() % sizeof(float) != 0) {
        throw py::value_error(StrCat("state of key ", key, ": ", updates, " updates, ",
                                     bytes.size(), " bytes of optimizer state (not whole floats)"));
      }
      ParamState& st = next[key];
      st.num_updates = updates;
      st.lr_mult = lr_mult;
      st.wd_mult = wd_mult;
      st.slots.resize(bytes.size() / sizeof(float));
      std::memcpy(st.slots.data(), bytes.data(), bytes.size());
    }
    // A fresh optimizer: its count is the one loaded, not the larger of the two.
    auto opt = Optimizer::Create(cfg_);
    ThrowIfError(opt.status());
    opt_ = std::move(opt).value();
    opt_->ContinueFrom(num_update);
    states_ = std::move(next);
  }

 private:
  const OptimizerConfig cfg_;
  const std::map<uint64_t, float> lr_mult_, wd_mult_;
  std::unique_ptr<Optimizer> opt_;
  std::unordered_map<uint64_t, ParamState> states_;
};

// MXNet's device merge with 2-bit compression: `grad` becomes what its codes
// carry (+-threshold or 0; NaN where residual + grad is not finite) and
// `residual` moves on (float32 buffers of equal size; common/gradient_compression.h).
void QuantizeTwoBitBuffers(const py::buffer& grad, const py::buffer& residual, float threshold) {
  ThrowIfError(ParseGradientCompression("2bit", threshold).status());
  const int64_t n = grad.request(true).size;
  const int64_t residual_n = residual.request(true).size;
  if (residual_n != n) {
    throw py::value_error(StrCat("the residual has ", residual_n, " elements, the gradient ", n));
  }
  float* gp = FloatBuffer(grad, n, true, "gradient");
  float* rp = FloatBuffer(residual, n, true, "residual");
  if (gp == rp) throw py::value_error("the gradient and the residual are the same buffer");
  QuantizeTwoBitInPlace(gp, rp, static_cast<size_t>(n), threshold);
}

// The role DMLC_ROLE (or nothing: worker) gives this process.
std::string ProcessRole() {
  Environment env;
  auto job = ReadJobEnv(env, /*cluster_required=*/false);
  ThrowIfError(job.status());
  return RoleName(job->role);
}

// Runs the scheduler or a server to the job's end; returns the exit code.
// None for a worker.
py::object RunRole() {
  std::optional<int> code;
  {
    py::gil_scoped_release release;
    code = RunClusterRole();
  }
  if (!code) return py::none();
  return py::int_(*code);
}

}  // namespace
}  // namespace pstrain

PYBIND11_MODULE(_pstrain, m) {
  using namespace pstrain;
  m.doc() = "pstrain's C++ core: roles, the KV client, the optimizer (see the pstrain package)";
  // Our log lines go to stderr, as the pstrain binary's do. A library already
  // in the process (PyTorch) may have set logging up first.
  if (!google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging("pstrain");
  }
  // The largest integer key a store takes (the wire's key field).
  m.attr("MAX_KEY") = kMaxUserKey;
  static py::exception<PyError> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const PyError& e) {
      error(e.what());
    }
  });

  m.def("process_role", &ProcessRole, "scheduler, server or worker, from DMLC_ROLE");
  m.def("run_role", &RunRole,
        "Runs the scheduler or a server to the job's end and returns the exit code; None for a "
        "worker.");
  m.def("optimizer_slots", &OptimizerSlots, py::arg("optimizer"),
        "The names of the per-key state arrays an optimizer (its to_dict()) keeps, in the "
        "order a key's state holds them; raises for a setting the servers refuse.");
  m.def("quantize_2bit", &QuantizeTwoBitBuffers, py::arg("grad"), py::arg("residual"),
        py::arg("threshold"),
        "2-bit gradient compression's round trip in place: grad becomes +-threshold or 0, "
        "residual keeps the rest (MXNet's device merge).");

  py::class_<Completion, std::shared_ptr<Completion>>(m, "Completion")
      .def("done", &Completion::done)
      .def("done_at", &Completion::done_at)
      .def(
          "wait", [](Completion& c, int64_t timeout_ms) { WaitCompletion(&c, timeout_ms); },
          py::arg("timeout_ms"));

  py::class_<Client>(m, "Client")
      .def(py::init<>())
      .def_property_readonly("rank", &Client::rank)
      .def_property_readonly("num_workers", &Client::num_workers)
      .def_property_readonly("num_servers", &Client::num_servers)
      .def_property_readonly("request_timeout_ms", &Client::request_timeout_ms)
      .def_property_readonly("closed", &Client::closed)
      .def("configure", &Client::Configure, py::arg("sync"), py::arg("optimizer"),
           py::arg("generation"), py::arg("wd_mult"), py::arg("gc_threshold") = py::none(),
           py::arg("lr_mult") = std::map<uint64_t, float>{})
      .def("init", &Client::Init)
      .def("replace", &Client::Replace)
      .def("push", &Client::Push)
      .def("pull", &Client::Pull)
      .def("pushpull", &Client::PushPull)
      .def("allreduce", &Client::AllReduce)
      .def("barrier", &Client::Barrier)
      .def("close", &Client::Close, py::arg("error") = "");

  py::class_<LocalUpdater>(m, "LocalUpdater")
      .def(py::init<const py::dict&, std::map<uint64_t, float>, std::map<uint64_t, float>>(),
           py::arg("optimizer"), py::arg("lr_mult") = std::map<uint64_t, float>{},
           py::arg("wd_mult") = std::map<uint64_t, float>{})
      .def("update", &LocalUpdater::Update)
      .def("get_states", &LocalUpdater::GetStates)
      .def("set_states", &LocalUpdater::SetStates, py::arg("num_update"), py::arg("states"));
}
