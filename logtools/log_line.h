// What one line of a training log says: the one parser of MXNet's (and our)
// training lines, used by the accuracy tables (log_table.h) and the live view
// of a job (job_view.h).
//
// A line is recognised wherever its record starts, so prefixes such as
// "INFO:root:", a timestamp, "Node[0] " or the launcher's "[worker-1] " do not
// matter. Epochs are as logged (0-based). Recognised (\t is a TAB):
//
//   Epoch[N] Train-<metric>=<value>                      kTrainMetric
//   Epoch[N] Validation-<metric>=<value>                 kValidationMetric
//   Epoch[N] Time cost=<seconds>                         kTimeCost
//   Epoch[N] Batch [B]\tSpeed: <x> samples/sec[\t<m>=<v>...]   kBatch
//     also "Iter[N] Batch [B]" (2015), "Batch [A-B]" (MXNet 1.4+; B is taken),
//     "\tTrain-<m>=<v>" metrics (MXNet 0.9), and no epoch at all (--test-io)
//   Epoch[N] Start: <B> batches of <S> samples; --num-epochs <T>   kEpochStart
//     (pstrain's trainer, FormatEpochStartLine in worker/train_log.h: what
//     an epoch's ETA needs; none of MXNet parse_log.py's patterns match it)
//
// A line holds at most one record: the first recognised one.
#ifndef PSTRAIN_LOGTOOLS_LOG_LINE_H_
#define PSTRAIN_LOGTOOLS_LOG_LINE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pstrain::logtools {

struct LogLine {
  enum class Kind { kNone, kTrainMetric, kValidationMetric, kTimeCost, kBatch, kEpochStart };
  Kind kind = Kind::kNone;
  int epoch = -1;  // as logged; -1 for a batch line without an epoch (--test-io)
  // kTrainMetric, kValidationMetric: one (name, value); kBatch: the metrics
  // after the speed, in order ("Train-" of MXNet 0.9 removed).
  std::vector<std::pair<std::string, double>> metrics;
  double seconds = 0;          // kTimeCost
  int64_t batch = -1;          // kBatch: the batch index B (0-based, as logged)
  double samples_per_sec = 0;  // kBatch
  int64_t epoch_batches = 0;   // kEpochStart: batches in this epoch
  int64_t batch_size = 0;      // kEpochStart: samples per batch
  int num_epochs = 0;          // kEpochStart: the epochs of the whole run (--num-epochs)
};

// Classifies `line` (without its newline; a trailing '\r' is ignored).
LogLine ParseLogLine(std::string_view line);

}  // namespace pstrain::logtools

#endif  // PSTRAIN_LOGTOOLS_LOG_LINE_H_
