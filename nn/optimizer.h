// Optimizers and learning-rate schedules, shared by the servers (dist modes)
// and the worker's local updater. Its own library (pstrain_optimizer, common
// and proto only), so the servers link no kernels. Semantics are MXNet 1.x's
// (python/mxnet/optimizer.py and the update operators; SGD in
// ../shared/reference/mxnet_facts.md 1.6). Every rule first takes
//
//   g <- rescale_grad * g
//
// and clip(x) below is x clipped to [-clip_gradient, clip_gradient] when
// clip_gradient > 0 (else x). lr is the schedule's rate times the parameter's
// lr_mult, wd the config's times its wd_mult.
//
//   SGD, momentum 0:  w <- w - lr * (clip(g) + wd * w)
//   SGD, momentum m:  mom <- m * mom - lr * (clip(g) + wd * w);  w <- w + mom
//   NAG, momentum m:  s = lr * (clip(g) + wd * w);  mom <- m * mom - s
//                     w <- w + m * mom - s   (MXNet 1.6+'s nag_mom_update;
//                     momentum 0: SGD's rule)
//   ADAM:             h = clip(g + wd * w);  mean <- b1 * mean + (1 - b1) * h
//                     var <- b2 * var + (1 - b2) * h^2
//                     w <- w - lr_t * mean / (sqrt(var) + eps),
//                     lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), t the
//                     parameter's update count (this one included)
//   RMSPROP:          h = clip(g + wd * w);  n <- (1 - g1) * h^2 + g1 * n
//                     w <- w - lr * h / sqrt(n + eps)
//   RMSPROP centered: n as above;  gm <- (1 - g1) * h + g1 * gm
//                     delta <- g2 * delta - lr * h / sqrt(n - gm^2 + eps)
//                     w <- w + delta
//                     (both: w clipped to [-clip_weights, clip_weights] if > 0)
//   ADAGRAD:          h = clip(g);  hist <- hist + h^2
//                     w <- w - lr * (h / sqrt(hist + eps) + wd * w)
//   TEST:             w <- w + g
//
// The learning rate follows the schedule in the number of updates, counted as
// MXNet does: the maximum over keys of the number of updates each key has had.
#ifndef PSTRAIN_NN_OPTIMIZER_H_
#define PSTRAIN_NN_OPTIMIZER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
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
  // The rule's per-element state: Optimizer::num_slots() arrays of n floats,
  // back to back, named by Optimizer::SlotNames() (SGD and NAG: momentum;
  // ADAM: mean, var; RMSPROP: n, or n, g, delta when centered; ADAGRAD:
  // history). Empty until the first update that keeps any.
  std::vector<float> slots;
  // Optimizer::SlotLayout() of the optimizer that wrote `slots`, so that an
  // optimizer of another kind starts from zeros instead of misreading them;
  // -1 (restored from a checkpoint file or a version-1 snapshot, which do not
  // say): the current optimizer's, if the size fits.
  int slot_layout = -1;
  int64_t num_updates = 0;
  // Added to num_updates for ADAM's count t (its bias correction): the
  // updates made before this run resumed from a checkpoint (the rate's
  // schedule does not count them, as the resumed configuration shifts its
  // steps), or minus those made before an optimizer of another layout took
  // the state over (it starts at t = 1).
  int64_t earlier_updates = 0;
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

// The optimizer named as MXNet and the command line spell it ("sgd", "nag",
// "adam", "rmsprop", "adagrad", "test"; any case): false for another name.
bool OptimizerTypeFromName(const std::string& name, OptimizerConfig::Type* type);
// Those names, for messages: "sgd, nag, adam, rmsprop, adagrad, test".
inline constexpr char kOptimizerNames[] = "sgd, nag, adam, rmsprop, adagrad, test";

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

  // Which rule a Step applies (the header's; RMSPROP split by `centered`).
  // The values are SlotLayout()s, which server snapshots store: add new rules
  // at the end, never renumber.
  enum class Rule : uint8_t { kSgd, kTest, kNag, kAdam, kRmsProp, kRmsPropCentered, kAdaGrad };

  // The constants of one update: what a device backend needs to apply the
  // rule above to a parameter in its own memory (nn/backend.h), the same
  // arithmetic as ApplyStep.
  struct Step {
    Rule rule = Rule::kSgd;
    float rescale = 1;
    float lr = 0;  // ADAM: lr_t, the bias correction folded in
    float wd = 0, clip = 0;
    bool do_clip = false;
    float mom = 0;                 // SGD, NAG
    float beta1 = 0, beta2 = 0;    // ADAM
    float gamma1 = 0, gamma2 = 0;  // RMSPROP
    float eps = 0;                 // ADAM, RMSPROP, ADAGRAD
    float clip_weights = 0;        // RMSPROP
    bool do_clip_weights = false;
    // The caller's name for the parameter updated (its index, say), which a
    // device backend reports back with a non-finite value it met
    // (Backend::TakeStepCheck); -1 when unnamed. Not part of the arithmetic.
    int param = -1;
    // Arrays of n floats of state the rule reads and writes (ParamState::slots).
    int num_slots() const { return SlotsOf(rule, mom); }
  };
  // Counts one update of the parameter whose state is `state` (and the global
  // count) and returns its constants, the learning rate taken from the
  // schedule at that count. Leaves state->slots alone: the caller keeps the
  // slots where the weights are. Same thread rules as Update.
  Step NextStep(ParamState* state);
  // The rule over n elements on the host: out from in, using and updating
  // the step's slots, slot j at state[j * stride, j * stride + n) (unused,
  // may be null, when s.num_slots() == 0). `in` and `out` are equal or do not
  // overlap; `grad` and the slots overlap neither nor each other (a loop
  // relies on it: no element depends on another's). The check's bad_grad is
  // 0 or -1.
  static UpdateCheck ApplyStep(const Step& s, const float* grad, const float* in, float* out,
                               float* state, size_t stride, size_t n);

  // The rate the next update with the current global count would use.
  float CurrentLr() const;
  int64_t num_update() const { return num_update_.load(std::memory_order_relaxed); }
  // Raises the global count to at least `num_update`: an optimizer built
  // again for a running job (fewer workers, a restarted server) goes on from
  // where the one it replaces was, so a key updated less often than others
  // keeps getting the schedule's current rate.
  void ContinueFrom(int64_t num_update);
  // Whether a step's arithmetic reads the parameter's update count (ADAM's
  // bias correction): a checkpoint must keep the count to resume it.
  bool reads_update_count() const { return rule_ == Rule::kAdam; }
  // The most slots any rule keeps (centered RMSPROP).
  static constexpr int kMaxSlots = 3;
  // How many arrays of a parameter's size each parameter's state holds
  // (Step::num_slots of every step), and their names, in order.
  int num_slots() const { return SlotsOf(rule_, cfg_.momentum()); }
  std::vector<std::string> SlotNames() const;
  // Identifies what the slots mean (ParamState::slot_layout): equal for two
  // optimizers whose slots may be carried from one to the other.
  int SlotLayout() const { return static_cast<int>(rule_); }
  // The same as a name: the type's ("sgd", "adam", ...), "rmsprop_centered"
  // for the centered rule.
  std::string SlotLayoutName() const;
  const OptimizerConfig& config() const { return cfg_; }
  // Its name as MXNet and the command line spell it ("sgd", "adam", ...).
  static const char* TypeName(OptimizerConfig::Type type);

 private:
  Optimizer(const OptimizerConfig& cfg, LrSchedule schedule);
  // Inline: a device backend's module (nn/cuda) reads Step::num_slots
  // without linking this file's object, and with it the protobuf code.
  static int SlotsOf(Rule rule, float momentum) {
    switch (rule) {
      case Rule::kSgd:
      case Rule::kNag:
        return momentum != 0.0f ? 1 : 0;
      case Rule::kTest:
        return 0;
      case Rule::kAdam:
        return 2;
      case Rule::kRmsProp:
      case Rule::kAdaGrad:
        return 1;
      case Rule::kRmsPropCentered:
        return 3;
    }
    return 0;
  }
  int64_t NoteUpdate(ParamState* state);
  // NextStep, plus the host slots (zeros) when the state holds none of this
  // optimizer's layout.
  Step Begin(size_t n, ParamState* state);

  OptimizerConfig cfg_;
  Rule rule_;
  LrSchedule schedule_;
  std::atomic<int64_t> num_update_{0};
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_OPTIMIZER_H_
