// Backend: what an executor computes with on one device. One class per
// device kind (nn/cpu/cpu_backend.h: oneDNN and the reference loops;
// nn/cuda/cuda_backend.h: cuDNN, cuBLAS and our kernels), chosen by
// Backend::Create from the device. The executor and the worker talk to a
// device only through this interface: memory, the operators of a graph, the
// copies between the host and the device, and the few element-wise steps the
// executor and the local optimizer need of their own.
//
// Ordering: a backend runs its work in the order it is asked for, as if on
// one queue (the CPU backend runs it at once, but for the asynchronous copies
// of one playing a device: BackendOptions::cpu_as_device; the CUDA backend
// enqueues it on its compute stream). CopyToHost and Synchronize wait for everything asked
// before them; the other calls may return before the device has finished.
// The asynchronous host copies (CopyToHostAsync, CopyFromHostAsync) return at
// once too, and a Fence (RecordFence) tells the host when everything asked
// before it, those copies included, has finished: a host thread then reads
// what a copy wrote, or reuses what it read. They are for pinned host memory
// (AllocatePinned), which the device reads and writes without staging.
//
// Threads: one thread at a time (the executor's). A backend and the tensors it
// allocated belong together: the backend must outlive them. A Fence and a
// pinned buffer may be used, waited on and released on any thread.
#ifndef PSTRAIN_NN_BACKEND_H_
#define PSTRAIN_NN_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "nn/graph.h"
#include "nn/optimizer.h"
#include "nn/tensor.h"

namespace pstrain {

class Operator;  // nn/operator.h

// Tensors that share one buffer (the executor's arena, Backend::ZerosPacked)
// start at multiples of this many floats: 256 bytes, what cuDNN and oneDNN
// like their tensors aligned to.
inline constexpr int64_t kTensorAlignFloats = 64;

// The CPU kernels: kOneDnn (the fast path; operators oneDNN does not cover
// run tuned loops) or kReference (plain loops: the oracle every other kernel,
// the GPU's included, is tested against).
enum class CpuKernels { kOneDnn, kReference };

struct BackendOptions {
  Device device = Device::Cpu();
  // ---- CPU ----
  CpuKernels cpu_kernels = CpuKernels::kOneDnn;
  // OpenMP team of the big operators; 0: the OpenMP default (OMP_NUM_THREADS,
  // else every core). Small operators run on one thread whatever this says.
  int num_threads = 0;
  // oneDNN kernels: keep activations channel-blocked between the layers that
  // compute fastest so (false: plain NCHW everywhere, each convolution
  // reorders at its boundary), and fuse a ReLU into the batch norm before it.
  // Both default on; benchmarks turn them off to measure what they bring.
  bool cpu_blocked_layouts = true;
  bool cpu_fusion = true;
  // ---- GPU ----
  // The most scratch memory one cuDNN convolution may use; the fastest
  // algorithm that fits is chosen once per shape (one within 3% of it that
  // needs less workspace, if any: nn/cuda/conv_choice.h).
  size_t gpu_workspace_bytes = size_t{512} << 20;
  // Let cuDNN convolutions use TF32 tensor cores (10-bit mantissa products,
  // float accumulation), as PyTorch does by default; false keeps them in full
  // float (the tests comparing with the CPU reference turn it off).
  bool gpu_tf32 = true;
  // Time the execution plans of cuDNN's graph API (its heuristics' engines,
  // as PyTorch's convolutions use them) beside the legacy algorithms, and run
  // each convolution direction with the faster, by the same rule
  // (nn/cuda/cudnn_graph.h, nn/cuda/conv_choice.h). On
  // by default: on an H100 it made six rows of bench/gpu_vs_pytorch.sh's
  // seven 1.13 to 1.27 times faster (ResNet-50 at batch 32: 1.25), the
  // seventh within its noise (bench/RESULTS.md); false leaves the legacy
  // search alone to decide (a shorter search at the start).
  bool gpu_conv_graph = true;
  // With gpu_conv_graph, for tests of the graph plans' numbers: a graph plan
  // wherever one runs (the fastest of them), even where the legacy algorithm
  // is faster.
  bool gpu_conv_graph_preferred = false;
  // ---- tests ----
  // The CPU backend plays a device the host cannot address, so that the
  // paths written for GPUs run (and are tested) without one: host_accessible()
  // is false, and its asynchronous copies wait in a queue as late as a GPU's
  // streams may run them: an upload until the next call into the backend, a
  // download until a fence recorded after it is polled or waited for, a
  // CopyToHost or Synchronize. Reading a download, or reusing an upload's
  // source, before its fence, or writing a download's source before it, then
  // reads or writes what a GPU would get wrong.
  bool cpu_as_device = false;
};

// Bytes of device memory this backend holds for tensors.
struct MemoryStats {
  size_t in_use = 0;    // handed out and not yet given back
  size_t peak = 0;      // most in_use ever
  size_t reserved = 0;  // taken from the device (in_use plus the allocator's cache)
};

// Work a backend did besides the operators' kernels, since it was created.
struct BackendCounters {
  // Layout changes of activations and their gradients (a CPU tensor reordered
  // between NCHW and oneDNN's blocked layout because a layer wants the other).
  int64_t activation_reorders = 0;
  // Layout changes of parameters and their gradients: the KV store, the
  // optimizer and checkpoints keep them in MXNet's OIHW, a convolution may
  // compute in another.
  int64_t param_reorders = 0;
};

// What a backend's optimizer updates (ApplyOptimizerStep) found, in the
// update's own pass as Optimizer::ApplyStep's check: the first update whose
// gradient held NaN or Inf, and the first that wrote NaN or Inf into its
// weights, each named by its Optimizer::Step::param.
struct StepCheck {
  bool bad_grad = false;
  int grad_param = -1;  // (when bad_grad) that update's step.param
  bool bad_weight = false;
  int weight_param = -1;  // (when bad_weight) that update's step.param
  bool ok() const { return !bad_grad && !bad_weight; }
};

// How long a host thread waits for work queued on a device (a Fence, and the
// waits inside Synchronize, CopyToHost and StopTiming) before it calls the
// device hung: far past any step's work, short of forever.
inline constexpr std::chrono::minutes kDeviceWaitTimeout{5};

// The host's view of a point in one backend's queue: done once everything
// asked of the backend before RecordFence() has finished on the device.
// Thread-safe; may outlive nothing but its backend.
class Fence {
 public:
  virtual ~Fence() = default;
  // Whether the work before the fence has finished (never blocks).
  virtual bool Done() = 0;
  // Returns Ok once Done(), or DeadlineExceeded, naming the device, once
  // `deadline` passes first (a hung device; the caller says what it waited
  // for). A device that reports an error aborts the process through the
  // backend's checks, as elsewhere.
  [[nodiscard]] virtual Status Wait(Deadline deadline) = 0;
};

// A fence with nothing to wait for (backends that compute at once).
class DoneFence : public Fence {
 public:
  bool Done() override { return true; }
  Status Wait(Deadline deadline) override { return Status::Ok(); }
};

// The most elements one tensor may hold on `device`: cuDNN's legacy API
// describes a GPU tensor with int dimensions and strides, so a GPU tensor
// stays below 2^31 elements (PyTorch splits such a batch into parts; pstrain
// says which batch fits). The executor checks every activation against it.
inline int64_t MaxTensorElements(const Device& device) {
  return device.is_cpu() ? std::numeric_limits<int64_t>::max()
                         : int64_t{std::numeric_limits<int32_t>::max()};
}

class Backend {
 public:
  // The backend for options.device. InvalidArgument for a GPU ordinal that
  // does not exist, Unimplemented for a device this build has no backend for
  // (a GPU without the CUDA backend), Unavailable when the device cannot be
  // used (no driver, out of memory); each message names the device.
  static StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& options);
  // The backends this build has, in factory order: "cpu" and, built with
  // CUDA, "cuda".
  static std::vector<std::string> Names();

  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  virtual Device device() const = 0;
  // One line for logs: "cpu (oneDNN, 2 threads)", "cuda gpu(0): NVIDIA H100 ...".
  virtual std::string Describe() const = 0;
  // Whether the host may read and write this backend's tensors through
  // Tensor::data() (the CPU backend). Callers that can avoid a copy then do.
  virtual bool host_accessible() const = 0;

  // ---- memory ----

  // Uninitialized memory for num_floats floats on device(). The CUDA backend
  // caches freed blocks, so a step loop that allocates what the last step
  // freed never calls cudaMalloc. ResourceExhausted, naming the device and
  // the bytes, when the device is out of memory.
  virtual StatusOr<std::shared_ptr<Buffer>> TryAllocate(size_t num_floats) = 0;
  // TryAllocate for memory that was planned for (the step loop's, say):
  // CHECK-fails when the device is out of memory.
  std::shared_ptr<Buffer> Allocate(size_t num_floats) {
    StatusOr<std::shared_ptr<Buffer>> b = TryAllocate(num_floats);
    CHECK(b.ok()) << b.status();
    return std::move(b).value();
  }
  Tensor Empty(const Shape& shape) {
    return Tensor(Allocate(static_cast<size_t>(shape.num_elements())), 0, shape);
  }
  Tensor Zeros(const Shape& shape) {
    Tensor t = Empty(shape);
    Fill(t, 0.0f);
    return t;
  }
  // Zeros, with ResourceExhausted as TryAllocate.
  StatusOr<Tensor> TryZeros(const Shape& shape) {
    ASSIGN_OR_RETURN(std::shared_ptr<Buffer> b,
                     TryAllocate(static_cast<size_t>(shape.num_elements())));
    Tensor t(std::move(b), 0, shape);
    Fill(t, 0.0f);
    return t;
  }
  // The operators `graph`'s nodes would have on options.device (null for
  // input nodes), made without the device (a GPU's come from the CUDA module;
  // no GPU need be present), for a memory plan made without it
  // (Executor::PlanWithoutDevice). They cannot be Setup. Unavailable where the
  // CUDA module cannot be loaded, Unimplemented where this build has no such
  // backend.
  static StatusOr<std::vector<std::unique_ptr<Operator>>> CreateOperatorsWithoutDevice(
      const BackendOptions& options, const Graph& graph);
  // Zeroed tensors of these shapes as views into one buffer, each at a
  // kTensorAlignFloats boundary: a block per tensor would round each large one
  // up to the allocator's granule (2 MiB on a GPU: about 26 MB per copy of
  // ResNet-50's weights).
  // ResourceExhausted as TryAllocate; ZerosPacked CHECK-fails instead.
  StatusOr<std::vector<Tensor>> TryZerosPacked(const std::vector<Shape>& shapes);
  std::vector<Tensor> ZerosPacked(const std::vector<Shape>& shapes);
  // Host memory (a Buffer of Device::Cpu(), 64-byte aligned) that this
  // backend's asynchronous copies use without staging: page-locked ("pinned")
  // on a GPU and usable by every GPU of the process; plain memory on the CPU.
  // Costly to allocate: allocate once and reuse. ResourceExhausted, naming
  // the bytes, when the host cannot give (or lock) that much.
  virtual StatusOr<std::shared_ptr<Buffer>> TryAllocatePinned(size_t num_floats) {
    return Buffer::TryAllocate(num_floats);
  }
  // TryAllocatePinned, CHECK-failing instead (tests).
  std::shared_ptr<Buffer> AllocatePinned(size_t num_floats) {
    StatusOr<std::shared_ptr<Buffer>> b = TryAllocatePinned(num_floats);
    CHECK(b.ok()) << b.status();
    return std::move(b).value();
  }
  virtual MemoryStats memory_stats() const = 0;
  virtual BackendCounters counters() const { return {}; }

  // ---- operators ----

  // The operator computing `node` on this device (not yet bound: the caller
  // runs its Setup). InvalidArgument for an input node, Unimplemented for an
  // op type this backend has no kernel for.
  virtual StatusOr<std::unique_ptr<Operator>> CreateOperator(const Node& node) = 0;
  // Called once per executor, before any Setup, with the graph it runs at
  // `batch` and, per node, whether the executor runs it in place (its output
  // and its input's gradient share storage with its input and its output's
  // gradient: Operator::CanRunInPlace). The CPU backend sizes the OpenMP team
  // of each node, plans activation layouts and fuses layers here.
  virtual void PlanGraph(const Graph& graph, int64_t batch, const std::vector<bool>& in_place) {}
  // Called on the executor's thread before each node's PlanScratch, Setup,
  // Forward and Backward (and the gradient sums after it).
  virtual void EnterNode(NodeId node) {}

  // ---- copies and element-wise steps (ordered with the operators) ----

  // Copies n = dst.num_elements() floats from host memory. Returns once `src`
  // may be reused; operations asked for later see the data.
  virtual void CopyFromHost(const float* src, const Tensor& dst) = 0;
  // Copies src.num_elements() floats to host memory; returns when `dst` holds them.
  virtual void CopyToHost(const Tensor& src, float* dst) = 0;
  // Asynchronous copies to and from host memory, for pinned memory
  // (AllocatePinned; other host memory works but may make the call wait).
  // CopyToHostAsync: dst receives src as the work asked before left it; dst
  // holds the values once a Fence recorded after this call is Done(), and
  // must stay valid until then. The device may run work asked later before
  // this copy has read src: REQUIRES that no such work writes src, and that
  // src's memory is not released, until that Fence is Done. CopyFromHostAsync: dst holds src's
  // values for every operation asked later; src must stay valid and unchanged until a Fence
  // recorded after this call is Done(). The device may start this copy before the work asked
  // earlier has finished: REQUIRES that no work asked earlier and not yet finished reads or writes
  // dst (the caller knows: it waited for a Fence recorded after that work). The CPU backend copies
  // at once (then src may be reused on return, dst holds the values on return), unless it plays a
  // device (cpu_as_device, below).
  virtual void CopyToHostAsync(const Tensor& src, float* dst) { CopyToHost(src, dst); }
  virtual void CopyFromHostAsync(const float* src, const Tensor& dst) { CopyFromHost(src, dst); }
  // A fence after everything asked of this backend so far (the CPU backend's
  // is done at once; playing a device, it runs the copies it covers when polled).
  virtual std::unique_ptr<Fence> RecordFence() { return std::make_unique<DoneFence>(); }
  // dst = src on this device. REQUIRES: same num_elements.
  virtual void Copy(const Tensor& src, const Tensor& dst) = 0;
  // dst (here) = src, a tensor of `from`, another backend of the same kind
  // (another GPU, or the same GPU listed twice; another CPU backend). After
  // the work asked of `from` so far, before the work asked here later and
  // before the work asked of `from` later (which may write `src` again).
  // REQUIRES: same num_elements; from.device().type == device().type.
  virtual void CopyPeer(Backend& from, const Tensor& src, const Tensor& dst) = 0;
  virtual void Fill(const Tensor& t, float value) = 0;
  // dst += src, element-wise. REQUIRES: same num_elements.
  virtual void Add(const Tensor& src, const Tensor& dst) = 0;
  // One optimizer update in device memory, Optimizer::ApplyStep's arithmetic:
  // weight and the step's slots updated in place from grad. `state` holds
  // step.num_slots() arrays of the weight's size back to back (undefined
  // when that is 0).
  // A gradient or a weight written holding NaN or Inf is applied like any
  // other (as Optimizer::ApplyStep does) and reported by TakeStepCheck.
  virtual void ApplyOptimizerStep(const Optimizer::Step& step, const Tensor& grad,
                                  const Tensor& weight, const Tensor& state) = 0;
  // What the updates found (StepCheck) since the last call, which clears it.
  // Never waits for the device: an update still running then is reported by
  // a later call; after Synchronize(), every update asked before it has been
  // reported by the next call. Of several bad updates between two calls, the
  // first of each kind is reported (a job stops at the first). Thread-safe
  // (a device group's merge thread may apply the updates).
  virtual StepCheck TakeStepCheck() = 0;
  // Returns when everything asked for so far has finished on the device.
  // A device that has not finished it within kDeviceWaitTimeout is hung: the
  // process ends with a message naming it, as on a device error (so do
  // CopyToHost and StopTiming, which wait too).
  virtual void Synchronize() = 0;

  // ---- timing (the executor's profile) ----
  // Starts timing the work asked for from now on.
  virtual void StartTiming() { timing_start_ = std::chrono::steady_clock::now(); }
  // Waits for the work asked for since StartTiming and returns the seconds it
  // took where it ran. The CPU's kernels are done when they return (the host
  // clock); a GPU's are timed by events on its stream, so neither the launch
  // nor the wait counts.
  virtual double StopTiming() {
    Synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - timing_start_).count();
  }

 protected:
  Backend() = default;

 private:
  std::chrono::steady_clock::time_point timing_start_;
};

// How many GPUs this build's CUDA backend can use. 0 when it has none, and
// then *why (if not null) says why: "built without CUDA (nvcc was not found
// at configure time)", "no CUDA driver", "no GPU visible (CUDA_VISIBLE_DEVICES=...)".
// Tests of the `gpu` label skip with that reason.
int GpuCount(std::string* why);

}  // namespace pstrain

#endif  // PSTRAIN_NN_BACKEND_H_
