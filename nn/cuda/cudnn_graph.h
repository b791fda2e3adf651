// One direction of a convolution through cuDNN's graph (backend) API: the
// operation graph, the execution plans of the engine configurations cuDNN's
// heuristics propose for it, and, once one is chosen, that plan run on bound
// pointers. PyTorch's convolutions take this path (cuDNN's frontend); the
// legacy cudnnFind* search reaches only the engines its fixed algorithm list
// maps to. CudnnConvolution (nn/cuda/cuda_ops.cc) times these plans beside
// the legacy algorithms when BackendOptions::gpu_conv_graph asks for it and
// keeps whichever is faster, direction by direction.
//
// Every call returns a Status naming the cuDNN call and its error: a shape or
// version cuDNN's graph API rejects makes the caller keep the legacy path.
#ifndef PSTRAIN_NN_CUDA_CUDNN_GRAPH_H_
#define PSTRAIN_NN_CUDA_CUDNN_GRAPH_H_

#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain::internal {

// (The order indexes the operations' attribute names in cudnn_graph.cc.)
enum class ConvDirection { kForward, kBackwardData, kBackwardFilter };
const char* ConvDirectionName(ConvDirection d);

// NCHW float tensors of one 2-D convolution (cross-correlation; the filter
// is (K, C / groups, R, S), so cuDNN infers the groups).
struct ConvGeometry {
  int64_t x[4], w[4], y[4];
  int64_t pad[2], stride[2];
};

// A cuDNN backend descriptor, destroyed with its owner.
class BackendDescriptor {
 public:
  BackendDescriptor() = default;
  ~BackendDescriptor();
  BackendDescriptor(BackendDescriptor&& o) noexcept : d_(o.d_) { o.d_ = nullptr; }
  BackendDescriptor& operator=(BackendDescriptor&& o) noexcept;
  BackendDescriptor(const BackendDescriptor&) = delete;
  BackendDescriptor& operator=(const BackendDescriptor&) = delete;

  static StatusOr<BackendDescriptor> Create(cudnnBackendDescriptorType_t type);
  cudnnBackendDescriptor_t get() const { return d_; }
  cudnnBackendDescriptor_t* addr() { return &d_; }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

class GraphConvolution {
 public:
  // The operation graph of `direction` for `g` on `handle`'s device. The
  // tensors' roles are fixed: x-shaped (x, or dx), w-shaped (w, or dw) and
  // y-shaped (y, or dy), in that order in Run and Bind. `beta` 1 adds the
  // result to what the output holds (the backward data's add-to), 0 writes it.
  static StatusOr<std::unique_ptr<GraphConvolution>> Create(cudnnHandle_t handle,
                                                            ConvDirection direction,
                                                            const ConvGeometry& g, float beta);
  ~GraphConvolution();

  // The execution plans of the engine configurations cuDNN's heuristics
  // propose (mode A's in its order, then the fallback list's while fewer
  // than `max_plans`) that finalize on this device and need at most
  // `workspace_limit` bytes of workspace; engines that convert the inputs
  // to a narrower type, reduce in reduced precision or compile at run time
  // are left out, and tensor-core engines (TF32 for float data) unless
  // `tf32`. Replaces any earlier list; an empty list is not an error.
  Status ListPlans(bool tf32, size_t workspace_limit, int max_plans);
  int num_plans() const { return static_cast<int>(plans_.size()); }
  size_t workspace_bytes(int i) const { return plans_.at(i).workspace; }

  // A variant pack for plan i on fixed pointers (the search's buffers, or
  // an operator's bound tensors), so that each call builds nothing.
  StatusOr<BackendDescriptor> Bind(int i, void* x, void* w, void* y, void* workspace) const;
  // Enqueues plan i with a pack that Bind made for it, on the stream of
  // `handle` (not waited for).
  Status Execute(int i, const BackendDescriptor& pack) const;

  // Keeps plan i only, as plan 0 (the others are freed).
  void Choose(int i);
  size_t chosen_workspace_bytes() const { return plans_.at(0).workspace; }
  const std::string& chosen_name() const { return plans_.at(0).name; }

 private:
  struct Plan {
    BackendDescriptor config, plan;
    size_t workspace = 0;
    std::string name;
  };
  explicit GraphConvolution(cudnnHandle_t handle) : handle_(handle) {}
  // Appends the usable plans of one heuristics mode's configurations.
  Status AddPlans(cudnnBackendHeurMode_t mode, bool tf32, size_t workspace_limit, int max_plans);

  cudnnHandle_t handle_;
  std::string where_;
  BackendDescriptor x_, w_, y_, conv_, op_, graph_;
  std::vector<Plan> plans_;
};

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CUDA_CUDNN_GRAPH_H_
