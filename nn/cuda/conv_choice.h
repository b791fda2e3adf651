// Which timed convolution algorithm runs: the rule that cuDNN's legacy search
// (cudnnFind*) and the race of its graph-API engines against the legacy choice
// share (nn/cuda/cuda_ops.cc).
//
// The fastest, unless one at most `kWorkspaceSlack` slower (about the
// timing's own noise) needs less workspace. The workspace is planned device
// memory: a plan a fraction of a percent faster that asks for hundreds of MB
// would grow the arena, and with it the peak memory that pstrain reports and
// the seeds compare, for a difference the timer cannot tell from noise.
//
// Plain C++ (no CUDA headers), so that a CPU test
// (tests/unit/nn/conv_choice_test.cc) checks the rule on machines without a GPU.
#ifndef PSTRAIN_NN_CUDA_CONV_CHOICE_H_
#define PSTRAIN_NN_CUDA_CONV_CHOICE_H_

#include <cstddef>
#include <vector>

namespace pstrain::internal::cuda {

inline constexpr float kWorkspaceSlack = 1.03f;

struct TimedAlgorithm {
  float ms = 0;          // measured (or cuDNN's estimate for its search)
  size_t workspace = 0;  // bytes
};

// The index in `timed` of the algorithm to run, or -1 if it is empty: the
// least workspace among those within `slack` of the fastest, the faster of
// two that need the same (the earlier of two equal in both).
inline int ChooseTimed(const std::vector<TimedAlgorithm>& timed, float slack = kWorkspaceSlack) {
  int fastest = -1;
  for (size_t i = 0; i < timed.size(); ++i) {
    if (fastest < 0 || timed[i].ms < timed[fastest].ms) fastest = static_cast<int>(i);
  }
  if (fastest < 0) return -1;
  int best = fastest;
  for (size_t i = 0; i < timed.size(); ++i) {
    const TimedAlgorithm& t = timed[i];
    if (t.ms > timed[fastest].ms * slack) continue;
    const TimedAlgorithm& b = timed[best];
    if (t.workspace < b.workspace || (t.workspace == b.workspace && t.ms < b.ms)) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

}  // namespace pstrain::internal::cuda

#endif  // PSTRAIN_NN_CUDA_CONV_CHOICE_H_
