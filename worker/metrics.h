// Evaluation metrics of the training loop: MXNet's `accuracy` and
// `top_k_accuracy_<k>`, accumulated over batches of softmax outputs.
#ifndef PSTRAIN_WORKER_METRICS_H_
#define PSTRAIN_WORKER_METRICS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pstrain {

// Counts correct predictions. Not thread-safe (one per loop).
class ClassificationMetrics {
 public:
  // top_k <= 1 tracks accuracy only; otherwise also top_k_accuracy_<top_k>.
  explicit ClassificationMetrics(int top_k = 0);

  // Scores the first `num_valid` rows of `probs` (rows of `num_classes` floats,
  // row-major) against `labels` (class indices as floats). Rows past num_valid
  // are padding and ignored. Accuracy takes the first maximal class (argmax).
  void Update(const float* probs, const float* labels, int64_t num_valid, int num_classes);
  void Reset();

  // (name, value) pairs in MXNet's order: accuracy, then top_k_accuracy_<k>.
  // A metric with no examples yet has value NaN (MXNet prints nan).
  std::vector<std::pair<std::string, double>> Get() const;
  int64_t num_examples() const { return num_; }

 private:
  int top_k_;
  int64_t num_ = 0;
  int64_t correct_ = 0;
  int64_t correct_top_k_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_METRICS_H_
