#include "worker/train_log.h"

#include <cstdarg>
#include <cstdio>

namespace pstrain {
namespace {

std::string Printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  int n = std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  if (n < static_cast<int>(sizeof(buf))) return std::string(buf, n < 0 ? 0 : n);
  std::string big(n + 1, '\0');
  va_start(args, fmt);
  std::vsnprintf(big.data(), big.size(), fmt, args);
  va_end(args);
  big.resize(n);
  return big;
}

}  // namespace

std::string FormatEpochStartLine(int epoch, int64_t epoch_batches, int64_t batch_size,
                                 int num_epochs) {
  return Printf("Epoch[%d] Start: %lld batches of %lld samples; --num-epochs %d", epoch,
                static_cast<long long>(epoch_batches), static_cast<long long>(batch_size),
                num_epochs);
}

std::string FormatSpeedLine(int epoch, int64_t batch, double samples_per_sec,
                            const MetricValues& metrics) {
  // MXNet's Speedometer says "Iter" when it has no metric to print.
  std::string line =
      Printf("%s[%d] Batch [%lld]\tSpeed: %.2f samples/sec", metrics.empty() ? "Iter" : "Epoch",
             epoch, static_cast<long long>(batch), samples_per_sec);
  for (const auto& [name, value] : metrics) line += Printf("\t%s=%f", name.c_str(), value);
  return line;
}

std::vector<std::string> FormatEpochMetricLines(int epoch, const std::string& prefix,
                                                const MetricValues& metrics) {
  std::vector<std::string> lines;
  for (const auto& [name, value] : metrics) {
    lines.push_back(Printf("Epoch[%d] %s-%s=%f", epoch, prefix.c_str(), name.c_str(), value));
  }
  return lines;
}

std::string FormatTimeCostLine(int epoch, double seconds) {
  return Printf("Epoch[%d] Time cost=%.3f", epoch, seconds);
}

std::string FormatSavedCheckpointLine(const std::string& path) {
  return "Saved checkpoint to \"" + path + "\"";
}

std::string FormatTestIoLine(int64_t batch, double samples_per_sec) {
  return Printf("Batch [%lld]\tSpeed: %.2f samples/sec", static_cast<long long>(batch),
                samples_per_sec);
}

TrainLog::TrainLog(std::function<void(const std::string&)> sink) : sink_(std::move(sink)) {}

void TrainLog::Info(const std::string& message) {
  std::string line = "INFO:root:" + message;
  if (sink_) {
    sink_(line);
    return;
  }
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace pstrain
