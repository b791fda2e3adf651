// Optimizers and learning-rate schedules, shared by the servers (dist modes)
// and the worker's local updater. Its own library (pstrain_optimizer, common
// and proto only), so the servers link no kernels. Semantics are MXNet's
// (../shared/reference/mxnet_facts.md 1.6):
//
//   g <- rescale_grad * g;  g <- clip(g, -clip, clip) if clip > 0
//   SGD, momentum 0:  w <- w - lr * (g + wd * w)
//   SGD, momentum m:  mom <- m * mom - lr * (g + wd * w);  w <- w + mom
//   TEST:             w <- w + rescale_grad * g
//
// The learning rate follows the schedule in the number of updates, counted as
// MXNet does: the maximum over keys of the number of updates each key has had.
#ifndef PSTRAIN_NN_OPTIMIZER_H_
#define PSTRAIN_NN_OPTIMIZER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "proto/optimizer.pb.h"

namespace pstrain {

// Learning rate as a function of the update count (1-based: the rate used by
// the num_update-th update).
class LrSchedule {
 public:
  // InvalidArgument for a step < 1, a factor outside (0, 1], or steps that do not increase.
  static StatusOr<LrSchedule> Create(float base_lr, const LrSchedulerConfig& cfg);
  float LrAt(int64_t num_update) const;

 private:
  LrSchedule() = default;
  float base_lr_ = 0.01f;
  LrSchedulerConfig cfg_;
};

// Per-parameter optimizer state, owned by whoever owns the parameter (a server
// shard or the local updater). Zero-initialized on first use.
struct ParamState {
  std::vector<float> momentum;  // empty until the first momentum update
  int64_t num_updates = 0;
  float lr_mult = 1.0f;  // MXNet's per-parameter multipliers (1.x: wd_mult 0 for biases, BN)
  float wd_mult = 1.0f;
};

// What an update saw, found in the same pass as the update (an integer test
// of the exponent bits per element, so it costs no extra pass over memory):
// NaN or Inf in a gradient, or in the weights it wrote. A job must not go on
// (or end well) with such weights.
struct UpdateCheck {
  int bad_grad = -1;        // index of the first gradient holding NaN or Inf, or -1
  bool bad_weight = false;  // the weights written hold NaN or Inf
  bool ok() const { return bad_grad < 0 && !bad_weight; }
};

// Whether x[0, n) holds no NaN and no Inf.
bool AllFinite(const float* x, size_t n);

class Optimizer {
 public:
  static StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& cfg);

  // Applies one update of `grad` to `weight` (n elements each).
  // Thread-safe for calls with different `state` objects; calls for one
  // parameter must be serialized by the caller. `grad` is not modified.
  // A non-finite gradient is applied like any other (the caller decides what
  // to do about it); the check says so.
  UpdateCheck Update(const float* grad, float* weight, size_t n, ParamState* state);
  // One update whose gradient is grads[0] + grads[1] + ... (summed in that
  // order, so the result equals Update on the summed array bit for bit),
  // without materializing the sum: a dist_sync server's round.
  // REQUIRES: num_grads >= 1.
  UpdateCheck Update(const float* const* grads, size_t num_grads, float* weight, size_t n,
                     ParamState* state);
  // The same, reading the weights from `in` and writing the result to `out`
  // (equal, or not overlapping): a server whose stored value is still being
  // read by a pull reply writes the update to a fresh buffer instead of
  // copying the value first.
  UpdateCheck Update(const float* const* grads, size_t num_grads, const float* in, float* out,
                     size_t n, ParamState* state);

  // The constants of one update: what a device backend needs to apply the
  // rule above to a parameter in its own memory (nn/backend.h), the same
  // arithmetic as ApplyStep.
  struct Step {
    float rescale = 1, lr = 0, wd = 0, clip = 0, mom = 0;
    bool do_clip = false;
    bool test = false;  // TEST: w <- w + rescale * g
    // The caller's name for the parameter updated (its index, say), which a
    // device backend reports back with a non-finite value it met
    // (Backend::TakeStepCheck); -1 when unnamed. Not part of the arithmetic.
    int param = -1;
    bool uses_momentum() const { return !test && mom != 0.0f; }
  };
  // Counts one update of the parameter whose state is `state` (and the global
  // count) and returns its constants, the learning rate taken from the
  // schedule at that count. Leaves state->momentum alone: the caller keeps
  // the momentum where the weights are. Same thread rules as Update.
  Step NextStep(ParamState* state);
  // The rule over n elements on the host: out = in - ..., using and updating
  // mom (n floats; unused, may be null, unless s.uses_momentum()). `in` and
  // `out` are equal or do not overlap. The check's bad_grad is 0 or -1.
  static UpdateCheck ApplyStep(const Step& s, const float* grad, const float* in, float* out,
                               float* mom, size_t n);

  // The rate the next update with the current global count would use.
  float CurrentLr() const;
  int64_t num_update() const { return num_update_.load(std::memory_order_relaxed); }
  // Raises the global count to at least `num_update`: an optimizer built
  // again for a running job (fewer workers, a restarted server) goes on from
  // where the one it replaces was, so a key updated less often than others
  // keeps getting the schedule's current rate.
  void ContinueFrom(int64_t num_update);
  // Whether its updates keep a momentum per parameter (Step::uses_momentum
  // of every step).
  bool uses_momentum() const {
    return cfg_.type() != OptimizerConfig::TEST && cfg_.momentum() != 0.0f;
  }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  Optimizer(const OptimizerConfig& cfg, LrSchedule schedule) : cfg_(cfg), schedule_(schedule) {}
  int64_t NoteUpdate(ParamState* state);
  // NextStep, plus the host momentum of n zeros on the first momentum update.
  Step Begin(size_t n, ParamState* state);

  OptimizerConfig cfg_;
  LrSchedule schedule_;
  std::atomic<int64_t> num_update_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_OPTIMIZER_H_
