// The log lines of training, exactly in MXNet's formats (mxnet_facts.md 3.5,
// v0.10-1.3 Speedometer), so MXNet's parse_log.py and `pstrain parse-log`
// read our logs:
//
//   Epoch[%d] Start: %lld batches of %d samples; --num-epochs %d   (ours)
//   Epoch[%d] Batch [%d]\tSpeed: %.2f samples/sec\taccuracy=%f
//   Iter[%d] Batch [%d]\tSpeed: %.2f samples/sec     (no metric: --emulate-compute)
//   Epoch[%d] Train-accuracy=%f
//   Epoch[%d] Time cost=%.3f
//   Saved checkpoint to "%s"
//   Epoch[%d] Validation-accuracy=%f
//   Batch [%d]\tSpeed: %.2f samples/sec              (--test-io)
//
// The start-of-epoch line is pstrain's own: what the live view of a job
// (logtools/job_view.h) needs for an epoch's ETA; it matches none of
// parse_log.py's patterns (Train, Valid, Time after "Epoch[N] "). Epochs are 0-based. The Format*
// functions return the message alone; a TrainLog writes each message as one line
// "INFO:root:<message>" (the prefix of every saved MXNet log) to its sink.
#ifndef PSTRAIN_WORKER_TRAIN_LOG_H_
#define PSTRAIN_WORKER_TRAIN_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pstrain {

using MetricValues = std::vector<std::pair<std::string, double>>;

// "Epoch[0] Start: 469 batches of 128 samples; --num-epochs 2" (logtools/log_line.h parses it).
std::string FormatEpochStartLine(int epoch, int64_t epoch_batches, int64_t batch_size,
                                 int num_epochs);
std::string FormatSpeedLine(int epoch, int64_t batch, double samples_per_sec,
                            const MetricValues& metrics);
// One line per metric: "Epoch[%d] Train-<name>=%f".
std::vector<std::string> FormatEpochMetricLines(int epoch, const std::string& prefix,
                                                const MetricValues& metrics);
std::string FormatTimeCostLine(int epoch, double seconds);
std::string FormatSavedCheckpointLine(const std::string& path);
std::string FormatTestIoLine(int64_t batch, double samples_per_sec);

// Where the trainer's MXNet-format lines go. Thread-compatible (one thread).
class TrainLog {
 public:
  // `sink` receives whole lines without the trailing newline; an empty sink
  // writes to stderr (like Python's logging) and flushes.
  explicit TrainLog(std::function<void(const std::string&)> sink = nullptr);
  void Info(const std::string& message);

 private:
  std::function<void(const std::string&)> sink_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAIN_LOG_H_
