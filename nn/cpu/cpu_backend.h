// The CPU backend (internal to nn/): oneDNN primitives or the reference
// loops, host memory, and the OpenMP team each node runs with.
#ifndef PSTRAIN_NN_CPU_CPU_BACKEND_H_
#define PSTRAIN_NN_CPU_CPU_BACKEND_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "nn/backend.h"
#include "nn/cpu/cpu_engine.h"
#include "nn/operator.h"

namespace pstrain::internal {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);

  // The CPU backend of an operator's context. REQUIRES: ctx.backend is one.
  static CpuBackend& Of(const OpContext& ctx);

  Device device() const override { return Device::Cpu(); }
  std::string Describe() const override;
  bool host_accessible() const override { return !options_.cpu_as_device; }

  StatusOr<std::shared_ptr<Buffer>> TryAllocate(size_t num_floats) override;
  MemoryStats memory_stats() const override;
  BackendCounters counters() const override;

  StatusOr<std::unique_ptr<Operator>> CreateOperator(const Node& node) override;
  // Sizes each node's OpenMP team (the whole team for nodes of at least
  // kParallelWork flops or long memory-bound passes, one thread below that),
  // plans the activation layouts (nn/cpu/layout.h) and fuses each in-place
  // ReLU into the batch norm before it (oneDNN's fused normalization).
  void PlanGraph(const Graph& graph, int64_t batch, const std::vector<bool>& in_place) override;
  // omp_set_num_threads(the node's team): oneDNN primitives are created for,
  // and run with, the team of their node. (This sets the calling thread's
  // OpenMP default, so the backend's own team is fixed when it is made.)
  // Playing a device, it first runs the queued copies, which the node may read.
  void EnterNode(NodeId node) override;

  void CopyFromHost(const float* src, const Tensor& dst) override;
  void CopyToHost(const Tensor& src, float* dst) override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void CopyPeer(Backend& from, const Tensor& src, const Tensor& dst) override;
  void Fill(const Tensor& t, float value) override;
  void Add(const Tensor& src, const Tensor& dst) override;
  void ApplyOptimizerStep(const Optimizer::Step& step, const Tensor& grad, const Tensor& weight,
                          const Tensor& state) override;
  StepCheck TakeStepCheck() override;
  // Queued while options.cpu_as_device (see there); at once otherwise.
  void CopyToHostAsync(const Tensor& src, float* dst) override;
  void CopyFromHostAsync(const float* src, const Tensor& dst) override;
  std::unique_ptr<Fence> RecordFence() override;
  void Synchronize() override { RunQueued(INT64_MAX, /*downloads=*/true); }

  CpuEngine& engine() { return engine_; }
  // The channel block of node `id`'s output and its gradient, 0 for plain
  // NCHW (always 0 for a node of a graph this backend did not plan).
  int layout(NodeId id) const { return Planned(layouts_, id); }
  // A batch norm that applies the ReLU after it (whose output is its own,
  // in place), and that ReLU, which then does nothing.
  bool fuses_relu(NodeId bn) const { return Planned(fuses_relu_, bn); }
  bool fused_away(NodeId relu) const { return Planned(fused_away_, relu); }
  CpuKernels kernels() const { return options_.cpu_kernels; }

 private:
  struct Counters;
  const BackendOptions options_;
  // The team of the large nodes: options_.num_threads, else the OpenMP
  // default (OMP_NUM_THREADS, else every core).
  const int team_;
  CpuEngine engine_;
  std::vector<int> threads_;  // per node, from PlanGraph
  std::vector<int> layouts_;  // per node, from PlanGraph
  std::vector<int> fuses_relu_, fused_away_;

  template <typename T>
  static T Planned(const std::vector<T>& v, NodeId id) {
    return id >= 0 && static_cast<size_t>(id) < v.size() ? v[id] : T{};
  }
  std::shared_ptr<Counters> counters_;

  // options_.cpu_as_device: the asynchronous copies asked for and not yet
  // run, in order. Every other call runs the uploads first (a GPU's compute
  // stream waits for them); the downloads wait for a fence after them, a
  // CopyToHost or Synchronize, so they read their source as late as a GPU's
  // download stream may (after later work wrote it, if the caller let it).
  class QueueFence;
  struct Queued {
    int64_t ticket;  // the how-manyth copy asked
    bool download;
    std::function<void()> copy;
  };
  // Runs the queued copies asked before copy number `upto`, the downloads
  // among them only when `downloads`.
  void RunQueued(int64_t upto, bool downloads) EXCLUDES(queue_mu_);
  void Enqueue(bool download, std::function<void()> copy) EXCLUDES(queue_mu_);
  Mutex queue_mu_;  // held while a queued copy runs, so they run in order
  std::deque<Queued> queued_ GUARDED_BY(queue_mu_);
  int64_t asked_ GUARDED_BY(queue_mu_) = 0;  // copies ever queued

  Mutex check_mu_;
  StepCheck check_ GUARDED_BY(check_mu_);  // ApplyOptimizerStep's, until taken
};

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options);

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CPU_CPU_BACKEND_H_
