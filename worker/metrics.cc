#include "worker/metrics.h"

#include <limits>

namespace pstrain {

ClassificationMetrics::ClassificationMetrics(int top_k) : top_k_(top_k) {}

void ClassificationMetrics::Reset() {
  num_ = 0;
  correct_ = 0;
  correct_top_k_ = 0;
}

void ClassificationMetrics::Update(const float* probs, const float* labels, int64_t num_valid,
                                   int num_classes) {
  for (int64_t i = 0; i < num_valid; ++i) {
    const float* row = probs + i * num_classes;
    const int label = static_cast<int>(labels[i]);
    int best = 0;
    for (int c = 1; c < num_classes; ++c) {
      if (row[c] > row[best]) best = c;
    }
    if (best == label) ++correct_;
    if (top_k_ > 1) {
      // The label is in the top k when fewer than k classes score strictly higher.
      int higher = 0;
      const float p = (label >= 0 && label < num_classes) ? row[label] : -1.0f;
      for (int c = 0; c < num_classes && higher < top_k_; ++c) {
        if (row[c] > p) ++higher;
      }
      if (label >= 0 && label < num_classes && higher < top_k_) ++correct_top_k_;
    }
  }
  num_ += num_valid;
}

std::vector<std::pair<std::string, double>> ClassificationMetrics::Get() const {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<std::string, double>> out;
  out.emplace_back("accuracy", num_ > 0 ? static_cast<double>(correct_) / num_ : nan);
  if (top_k_ > 1) {
    out.emplace_back("top_k_accuracy_" + std::to_string(top_k_),
                     num_ > 0 ? static_cast<double>(correct_top_k_) / num_ : nan);
  }
  return out;
}

}  // namespace pstrain
