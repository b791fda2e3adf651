#include "nn/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "nn/cpu/cpu_ops.h"
#include "nn/cpu/layout.h"

namespace pstrain::internal {
namespace {

// Rough floating-point work of one node's forward for the batch.
double NodeWork(const Graph& g, const Node& n, int64_t batch) {
  const double out = static_cast<double>(n.out_shape.num_elements() * batch);
  switch (n.op) {
    case OpType::kConvolution: {
      const Shape& in = g.node(n.inputs[0]).out_shape;
      return 2.0 * out * static_cast<double>(in[0] / n.conv.num_group) * n.conv.kernel_h *
             n.conv.kernel_w;
    }
    case OpType::kFullyConnected:
      return 2.0 * out * static_cast<double>(g.node(n.inputs[0]).out_shape.num_elements());
    case OpType::kPooling:
      return out * n.pool.kernel_h * n.pool.kernel_w;
    default: {
      double in = 0;
      for (NodeId i : n.inputs) in += static_cast<double>(g.node(i).out_shape.num_elements());
      return 4.0 * (out + in * static_cast<double>(batch));
    }
  }
}

// Below this much work (about 4 ms of one core) a node runs on one thread: on
// a loaded machine a team's barrier can cost a whole scheduler slice.
constexpr double kParallelWork = 2e8;

// Memory-bound layers (batch norm, activations, sums, poolings, concat) with
// at least this many output floats (4 MB) use the team whatever their flops:
// a second core adds bandwidth, and the pass is long enough to pay the barrier.
constexpr int64_t kParallelFloats = int64_t{1} << 20;

// Element-wise loops shorter than this stay on the calling thread.
constexpr int64_t kParallelElements = 1 << 15;

// The OpenMP default team (OMP_NUM_THREADS, else every core). It is read on
// a new thread, which starts from the default: on a thread that has run
// nodes, omp_get_max_threads() gives the team EnterNode last set there (often
// 1), and a backend made there once took that for the default.
int DefaultTeam() {
  static const int team = [] {
    int n = 1;
    std::thread([&n] { n = omp_get_max_threads(); }).join();
    return n;
  }();
  return team;
}

}  // namespace

struct CpuBackend::Counters {
  std::atomic<size_t> in_use{0};
  std::atomic<size_t> peak{0};
};

CpuBackend::CpuBackend(const BackendOptions& options)
    : options_(options),
      team_(options.num_threads > 0 ? options.num_threads : DefaultTeam()),
      counters_(std::make_shared<Counters>()) {}

CpuBackend& CpuBackend::Of(const OpContext& ctx) {
  CHECK(ctx.backend != nullptr && ctx.backend->device().is_cpu())
      << "a CPU operator run with a backend for "
      << (ctx.backend ? ctx.backend->device().ToString() : "nothing");
  return *static_cast<CpuBackend*>(ctx.backend);
}

std::string CpuBackend::Describe() const {
  return StrCat("cpu (", options_.cpu_kernels == CpuKernels::kOneDnn ? "oneDNN" : "reference",
                " kernels, ", team_, team_ == 1 ? " thread" : " threads",
                options_.cpu_as_device ? ", as a device)" : ")");
}

StatusOr<std::shared_ptr<Buffer>> CpuBackend::TryAllocate(size_t num_floats) {
  StatusOr<std::shared_ptr<Buffer>> host = Buffer::TryAllocate(num_floats);
  if (!host.ok()) {
    return host.status().WithContext(
        StrCat("cpu (", counters_->in_use.load(), " bytes in use by this backend)"));
  }
  const size_t bytes = Buffer::HostBytes(num_floats);
  const size_t now = counters_->in_use.fetch_add(bytes) + bytes;
  size_t peak = counters_->peak.load();
  while (now > peak && !counters_->peak.compare_exchange_weak(peak, now)) {
  }
  // The host buffer goes with this one; the count drops first.
  std::shared_ptr<Counters> counters = counters_;
  return Buffer::Wrap(
      (*host)->data(), num_floats, Device::Cpu(),
      [counters, bytes, host = *host](float*) { counters->in_use.fetch_sub(bytes); });
}

MemoryStats CpuBackend::memory_stats() const {
  MemoryStats s;
  s.in_use = counters_->in_use.load();
  s.peak = counters_->peak.load();
  s.reserved = s.in_use;
  return s;
}

BackendCounters CpuBackend::counters() const {
  BackendCounters c;
  c.activation_reorders = engine_.activation_reorders;
  c.param_reorders = engine_.param_reorders;
  return c;
}

StatusOr<std::unique_ptr<Operator>> CpuBackend::CreateOperator(const Node& node) {
  if (node.op == OpType::kInput) {
    return Status::InvalidArgument(StrCat("node '", node.name, "' is an input, not an operator"));
  }
  std::unique_ptr<Operator> op;
  if (options_.cpu_kernels == CpuKernels::kOneDnn) op = MakeDnnlOperator(node);
  if (op == nullptr) op = MakeReferenceOperator(node);
  if (op == nullptr) {
    return Status::Unimplemented(
        StrCat("node '", node.name, "': no CPU kernel for ", OpTypeName(node.op)));
  }
  return op;
}

void CpuBackend::PlanGraph(const Graph& graph, int64_t batch, const std::vector<bool>& in_place) {
  threads_.assign(graph.nodes().size(), 1);
  for (const Node& n : graph.nodes()) {
    if (n.op == OpType::kInput) continue;
    const bool compute_bound = n.op == OpType::kConvolution || n.op == OpType::kFullyConnected;
    if (NodeWork(graph, n, batch) >= kParallelWork ||
        (!compute_bound && n.out_shape.num_elements() * batch >= kParallelFloats)) {
      threads_[n.id] = team_;
    }
  }
  const bool onednn = options_.cpu_kernels == CpuKernels::kOneDnn;
  const bool blocked = onednn && options_.cpu_blocked_layouts;
  layouts_ = PlanActivationLayouts(graph, blocked ? PreferredChannelBlock() : 0);
  fuses_relu_.assign(graph.nodes().size(), 0);
  fused_away_.assign(graph.nodes().size(), 0);
  if (!onednn || !options_.cpu_fusion) return;
  for (const Node& n : graph.nodes()) {
    if (n.op != OpType::kActivation || n.act != ActType::kRelu || !in_place[n.id]) continue;
    const Node& bn = graph.node(n.inputs[0]);
    if (bn.op != OpType::kBatchNorm) continue;
    fuses_relu_[bn.id] = 1;
    fused_away_[n.id] = 1;
  }
}

void CpuBackend::EnterNode(NodeId node) {
  RunQueued(INT64_MAX, /*downloads=*/false);
  if (node >= 0 && static_cast<size_t>(node) < threads_.size()) {
    omp_set_num_threads(threads_[node]);
  }
}

// A fence over the first `ticket` queued copies of a backend playing a device.
// Polling it runs them (memory copies, under the queue's lock: it waits for
// no other work).
class CpuBackend::QueueFence : public Fence {
 public:
  QueueFence(CpuBackend* backend, int64_t ticket) : backend_(backend), ticket_(ticket) {}
  bool Done() override {
    backend_->RunQueued(ticket_, /*downloads=*/true);
    return true;
  }
  Status Wait(Deadline deadline) override {
    backend_->RunQueued(ticket_, /*downloads=*/true);  // memory copies: they end
    return Status::Ok();
  }

 private:
  CpuBackend* const backend_;
  const int64_t ticket_;
};

void CpuBackend::RunQueued(int64_t upto, bool downloads) {
  if (!options_.cpu_as_device) return;
  MutexLock l(&queue_mu_);
  for (auto it = queued_.begin(); it != queued_.end() && it->ticket < upto;) {
    if (it->download && !downloads) {
      ++it;
      continue;
    }
    it->copy();
    it = queued_.erase(it);
  }
}

void CpuBackend::Enqueue(bool download, std::function<void()> copy) {
  MutexLock l(&queue_mu_);
  queued_.push_back(Queued{asked_++, download, std::move(copy)});
}

void CpuBackend::CopyToHostAsync(const Tensor& src, float* dst) {
  if (!options_.cpu_as_device) return CopyToHost(src, dst);
  Enqueue(/*download=*/true, [src, dst] { std::memcpy(dst, src.data(), src.bytes()); });
}

void CpuBackend::CopyFromHostAsync(const float* src, const Tensor& dst) {
  if (!options_.cpu_as_device) return CopyFromHost(src, dst);
  Enqueue(/*download=*/false, [src, dst] { std::memcpy(dst.data(), src, dst.bytes()); });
}

std::unique_ptr<Fence> CpuBackend::RecordFence() {
  if (!options_.cpu_as_device) return std::make_unique<DoneFence>();
  MutexLock l(&queue_mu_);
  return std::make_unique<QueueFence>(this, asked_);
}

void CpuBackend::CopyFromHost(const float* src, const Tensor& dst) {
  RunQueued(INT64_MAX, /*downloads=*/false);
  if (src != dst.data()) std::memcpy(dst.data(), src, dst.bytes());
}

void CpuBackend::CopyToHost(const Tensor& src, float* dst) {
  RunQueued(INT64_MAX, /*downloads=*/true);
  if (src.data() != dst) std::memcpy(dst, src.data(), src.bytes());
}

void CpuBackend::Copy(const Tensor& src, const Tensor& dst) {
  CHECK_EQ(src.num_elements(), dst.num_elements());
  RunQueued(INT64_MAX, /*downloads=*/false);
  if (src.data() != dst.data()) std::memcpy(dst.data(), src.data(), dst.bytes());
}

void CpuBackend::CopyPeer(Backend& from, const Tensor& src, const Tensor& dst) {
  CHECK(from.device().is_cpu()) << "CopyPeer from " << from.device().ToString() << " to the CPU";
  from.Synchronize();  // after the work asked of `from` so far
  Copy(src, dst);
}

void CpuBackend::Fill(const Tensor& t, float value) {
  RunQueued(INT64_MAX, /*downloads=*/false);
  t.Fill(value);
}

void CpuBackend::Add(const Tensor& src, const Tensor& dst) {
  RunQueued(INT64_MAX, /*downloads=*/false);
  CHECK_EQ(src.num_elements(), dst.num_elements());
  float* d = dst.data();
  const float* s = src.data();
  const int64_t n = dst.num_elements();
#pragma omp parallel for simd schedule(static) if (n > kParallelElements)
  for (int64_t k = 0; k < n; ++k) d[k] += s[k];
}

void CpuBackend::ApplyOptimizerStep(const Optimizer::Step& step, const Tensor& grad,
                                    const Tensor& weight, const Tensor& state) {
  RunQueued(INT64_MAX, /*downloads=*/false);
  CHECK_EQ(grad.num_elements(), weight.num_elements());
  const int64_t n = weight.num_elements();
  float* slots = nullptr;
  if (step.num_slots() > 0) {
    CHECK_EQ(state.num_elements(), step.num_slots() * n);
    slots = state.data();
  }
  const UpdateCheck c = Optimizer::ApplyStep(step, grad.data(), weight.data(), weight.data(), slots,
                                             static_cast<size_t>(n), static_cast<size_t>(n));
  if (c.ok()) return;
  MutexLock l(&check_mu_);
  if (c.bad_grad >= 0 && !check_.bad_grad) {
    check_.bad_grad = true;
    check_.grad_param = step.param;
  }
  if (c.bad_weight && !check_.bad_weight) {
    check_.bad_weight = true;
    check_.weight_param = step.param;
  }
}

StepCheck CpuBackend::TakeStepCheck() {
  MutexLock l(&check_mu_);
  const StepCheck c = check_;
  check_ = StepCheck();
  return c;
}

StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const BackendOptions& options) {
  if (options.num_threads < 0) {
    return Status::InvalidArgument(
        StrCat("CPU threads must be >= 0 (0: all cores), got ", options.num_threads));
  }
  return std::unique_ptr<Backend>(new CpuBackend(options));
}

}  // namespace pstrain::internal
