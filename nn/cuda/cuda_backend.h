// The CUDA backend (internal to nn/): one GPU, one compute stream on which
// every operator, copy and element-wise step runs in the order asked for,
// cuDNN and cuBLAS handles bound to that stream, a caching allocator, and a
// copy stream with pinned staging buffers for the copies from the host.
//
// Copies from the host (batches, parameters) go host -> pinned buffer ->
// (copy stream) device staging buffer -> (compute stream) destination, so a
// batch crosses the bus while the compute stream still works on the previous
// one, and the destination is written only in the compute stream's order.
//
// The asynchronous host copies use pinned memory directly: CopyToHostAsync
// runs on a download stream that first waits (an event) for the compute
// stream's work so far; CopyFromHostAsync runs on the copy stream without
// waiting for the compute stream (Backend's REQUIRES), and the compute
// stream waits for it before its later work. A Fence is an event recorded on
// the download stream after it waited for the compute stream: it covers the
// operators, the downloads, and (through the compute stream's waits) the
// uploads asked before it.
#ifndef PSTRAIN_NN_CUDA_CUDA_BACKEND_H_
#define PSTRAIN_NN_CUDA_CUDA_BACKEND_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "nn/backend.h"
#include "nn/caching_allocator.h"
#include "nn/cuda/cudnn_graph.h"
#include "nn/operator.h"

namespace pstrain::internal {

// One direction of a convolution as cuDNN's search chose it: the algorithm,
// the math it was timed under (the search lists an algorithm once per math
// type the descriptor allows; the descriptor is set to this one before each
// call) and the workspace it needs under that math.
// With BackendOptions::gpu_conv_graph, `graph` holds the graph API's plan
// when it timed faster than the legacy algorithm (then algo and math are
// unused and bytes is the plan's workspace).
template <typename Algo>
struct ConvChoice {
  Algo algo{};
  cudnnMathType_t math = CUDNN_FMA_MATH;
  size_t bytes = 0;
  std::shared_ptr<GraphConvolution> graph;
};
// The three directions for one convolution shape (cached per backend: equal
// layers search once).
struct ConvAlgos {
  ConvChoice<cudnnConvolutionFwdAlgo_t> fwd;
  ConvChoice<cudnnConvolutionBwdDataAlgo_t> bwd_data;
  ConvChoice<cudnnConvolutionBwdFilterAlgo_t> bwd_filter;
};

class FenceEventPool;  // cuda_backend.cc

class CudaBackend : public Backend {
 public:
  // Unavailable (with the CUDA error) when the device cannot be set up;
  // InvalidArgument for an ordinal with no GPU.
  static StatusOr<std::unique_ptr<CudaBackend>> Create(const BackendOptions& options);
  ~CudaBackend() override;

  // The CUDA backend of an operator's context. REQUIRES: ctx.backend is one.
  static CudaBackend& Of(const OpContext& ctx);

  Device device() const override { return Device::Gpu(ordinal_); }
  std::string Describe() const override;
  bool host_accessible() const override { return false; }

  StatusOr<std::shared_ptr<Buffer>> TryAllocate(size_t num_floats) override;
  StatusOr<std::shared_ptr<Buffer>> TryAllocatePinned(size_t num_floats) override;
  MemoryStats memory_stats() const override { return allocator_->stats(); }

  StatusOr<std::unique_ptr<Operator>> CreateOperator(const Node& node) override;
  // Makes this backend's GPU the calling thread's current device.
  void EnterNode(NodeId node) override;

  void CopyFromHost(const float* src, const Tensor& dst) override;
  void CopyToHost(const Tensor& src, float* dst) override;
  void CopyToHostAsync(const Tensor& src, float* dst) override;
  void CopyFromHostAsync(const float* src, const Tensor& dst) override;
  std::unique_ptr<Fence> RecordFence() override;
  void Copy(const Tensor& src, const Tensor& dst) override;
  void CopyPeer(Backend& from, const Tensor& src, const Tensor& dst) override;
  void Fill(const Tensor& t, float value) override;
  void Add(const Tensor& src, const Tensor& dst) override;
  void ApplyOptimizerStep(const Optimizer::Step& step, const Tensor& grad, const Tensor& weight,
                          const Tensor& state) override;
  // Reads the flags the update kernel sets (mapped pinned memory): no wait.
  StepCheck TakeStepCheck() override;
  void Synchronize() override;
  void StartTiming() override;
  double StopTiming() override;

  // ---- for the operators (nn/cuda/*_ops.cc) ----
  cudaStream_t stream() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  const BackendOptions& options() const { return options_; }
  // Raw device bytes from the caching allocator, for an operator's own state
  // (saved statistics, masks); freed when the returned buffer goes.
  // ResourceExhausted naming the device, `what` and the bytes when the
  // device is out of memory.
  StatusOr<std::shared_ptr<Buffer>> TryAllocateBytes(size_t bytes, const std::string& what);
  // The cache of convolution algorithms, keyed by the shape's text.
  std::map<std::string, ConvAlgos>& conv_algos() { return conv_algos_; }
  // A convolution direction searched with the graph API beside the legacy
  // algorithms: which won, or that the graph API could not build it
  // (Describe reports the counts).
  enum class ConvSearch { kLegacyFaster, kGraphFaster, kGraphUnavailable };
  void CountConvSearch(ConvSearch outcome) { ++conv_searches_[static_cast<int>(outcome)]; }
  // Returns once everything queued on `stream` so far has finished. Polled
  // with a deadline (kDeviceWaitTimeout), as the CUDA calls that block have
  // none; a device that misses it is hung, and the process ends with a
  // message naming the device and `what` (AwaitEvent likewise). `cleanup`
  // (a destructor after a failure that the caller reports): an error of the
  // stream is logged instead, and the wait ends.
  void AwaitStream(cudaStream_t stream, const char* what, bool cleanup = false) const;

 private:
  explicit CudaBackend(const BackendOptions& options);
  Status Init();
  void SetDevice() const;
  void AwaitEvent(cudaEvent_t event, const char* what) const;
  // Polls done() until it says yes, with that deadline and that end.
  void Await(const std::function<bool()>& done, const char* what) const;
  // Lets this GPU and GPU `peer` read each other's memory where the pair
  // allows it (NVLink, PCIe peer-to-peer), the first time they copy:
  // without it cudaMemcpyPeerAsync stages every copy through host memory.
  void EnablePeerAccess(int peer);

  // A pinned host buffer and a device buffer that a host copy passes through.
  // The ring starts with kStagingSlots and grows to a copy's chunks plus two
  // (AddStagingSlot), up to kMaxStagingSlots, so that no copy of up to
  // kMaxStagingSlots - 2 chunks waits for its own earlier chunks: their
  // device buffers are emptied by the compute stream after the work queued
  // before the copy, and a batch larger than the ring crosses the bus only
  // as the compute stream empties the slots (the previous step's work
  // first). A larger copy goes through the capped ring chunk by chunk, so the
  // ring's memory stays bounded whatever the copies; a ring that cannot grow
  // (memory short) serves with the slots it has.
  //
  // Reuse of a slot: its pinned buffer is rewritten once the copy stream's
  // upload from it is done (`uploaded`, waited for by the host); its device
  // buffer once the compute stream's copy out of it is (`consumed`, waited
  // for by the copy stream before the next upload). No other stream touches
  // a slot.
  struct Staging {
    float* host = nullptr;           // pinned, kStagingBytes
    std::shared_ptr<Buffer> device;  // kStagingBytes
    cudaEvent_t uploaded = nullptr;  // copy stream: host -> device staging done
    cudaEvent_t consumed = nullptr;  // compute stream: staging -> destination done
    bool used = false;
  };
  static constexpr int kStagingSlots = 4;
  static constexpr int kMaxStagingSlots = 32;  // 128 MiB pinned, and as much on the device
  static constexpr size_t kStagingBytes = size_t{4} << 20;

  const BackendOptions options_;
  const int ordinal_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t peer_event_ = nullptr;        // recorded on this stream for a peer's CopyPeer
  cudaEvent_t copied_event_ = nullptr;      // recorded here after a CopyPeer, for the peer
  cudaStream_t download_stream_ = nullptr;  // CopyToHostAsync, fences
  // Recorded and waited for at once (reusing one event is safe then): the
  // download stream waits for the compute stream, and the compute stream
  // for an upload on the copy stream.
  cudaEvent_t compute_done_ = nullptr;
  cudaEvent_t upload_done_ = nullptr;
  cudaEvent_t timing_start_ = nullptr, timing_stop_ = nullptr;  // StartTiming, StopTiming
  // RecordFence's events, reused (shared with the fences, which give theirs
  // back from any thread).
  std::shared_ptr<FenceEventPool> fence_events_;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  std::shared_ptr<CachingAllocator> allocator_;
  // Appends a slot to the ring; on an error (out of pinned or device memory)
  // the ring is as it was.
  Status AddStagingSlot();
  std::vector<Staging> staging_;
  int next_slot_ = 0;
  bool staging_full_ = false;  // growing failed once (logged): the ring stays
  float* download_ = nullptr;  // pinned, kStagingBytes, for CopyToHost
  // ApplyOptimizerStep's check (cuda::UpdateArgs::flags): two words of mapped
  // pinned memory that the update kernel sets and TakeStepCheck reads and
  // clears; [0] a gradient, [1] a weight written held NaN or Inf.
  unsigned long long* step_flags_ = nullptr;         // the host's address
  unsigned long long* step_flags_device_ = nullptr;  // the kernel's
  std::map<std::string, ConvAlgos> conv_algos_;
  int conv_searches_[3] = {0, 0, 0};  // CountConvSearch, by outcome (the executor's thread)
  Mutex peers_mu_;                    // CopyPeer may run on several merge threads
  std::set<int> peers_seen_ GUARDED_BY(peers_mu_);
};

// The operator for `node` on the CUDA backend (nn/cuda/cuda_ops.cc).
StatusOr<std::unique_ptr<Operator>> MakeCudaOperator(const Node& node);

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CUDA_CUDA_BACKEND_H_
