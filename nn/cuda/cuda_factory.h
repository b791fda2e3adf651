// The CUDA backend is a loadable module (libpstrain_cuda.so, built beside the
// `pstrain` binary): the binary itself links no CUDA library, so it starts on
// hosts without the CUDA runtime or cuDNN (a CPU-only host of a cluster), and
// the factory (nn/backend.cc) loads the module the first time a GPU is asked
// for. These are the module's entry points; plain C++ types, no CUDA headers.
//
// The module carries its own copies of the engine's core (tensors, operators,
// the allocator) built from the same sources; kCudaModuleAbi and the sizes in
// CudaModuleAbi guard against a module from another build.
#ifndef PSTRAIN_NN_CUDA_CUDA_FACTORY_H_
#define PSTRAIN_NN_CUDA_CUDA_FACTORY_H_

#include <cstddef>
#include <memory>
#include <string>

#include "nn/backend.h"
#include "nn/operator.h"

namespace pstrain::internal {

// Bump whenever Backend, Operator, Tensor, Buffer, BackendOptions, Node or
// these entry points change shape (the sizes below catch most such changes,
// not a reordered vtable).
inline constexpr int kCudaModuleAbi = 7;

// `version` stays the first member in every ABI: a module writes only it into
// a caller whose room is smaller than its own struct.
struct CudaModuleAbi {
  int version = kCudaModuleAbi;
  size_t backend_options = sizeof(BackendOptions);
  size_t tensor = sizeof(Tensor);
  size_t op_context = sizeof(OpContext);
  size_t memory_stats = sizeof(MemoryStats);
  // What else crosses the boundary: the node an operator is made from, the
  // shapes in it, the statuses coming back, the tensors an operator binds.
  size_t node = sizeof(Node);
  size_t shape = sizeof(Shape);
  size_t status = sizeof(Status);
  size_t op_tensors = sizeof(OpTensors);
  bool operator==(const CudaModuleAbi& o) const {
    return version == o.version && backend_options == o.backend_options && tensor == o.tensor &&
           op_context == o.op_context && memory_stats == o.memory_stats && node == o.node &&
           shape == o.shape && status == o.status && op_tensors == o.op_tensors;
  }
};

// InvalidArgument for an ordinal with no GPU; Unavailable when the driver or
// the device fails (the CUDA error string in the message).
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);
// GPUs the driver shows this process; 0 and the reason in *why when none.
int CudaDeviceCount(std::string* why);

}  // namespace pstrain::internal

// The symbols the factory looks up (extern "C": unmangled names).
extern "C" {
// Writes the module's CudaModuleAbi into `abi`, which has `room` bytes (the
// whole struct only if it fits; else its version alone). The binary asks with
// room to spare, since a module of ABI 6 or older takes no `room` and writes
// its whole struct.
void PstrainCudaModuleAbi(pstrain::internal::CudaModuleAbi* abi, size_t room);
void PstrainCreateCudaBackend(const pstrain::BackendOptions& options,
                              pstrain::StatusOr<std::unique_ptr<pstrain::Backend>>* out);
int PstrainCudaDeviceCount(std::string* why);
// The CUDA operator for `node`, not bound to any backend (no device is
// touched): what it says of its backward and its in-place use, for a memory
// plan made without a GPU (Executor::PlanWithoutDevice).
void PstrainMakeCudaOperator(const pstrain::Node& node,
                             pstrain::StatusOr<std::unique_ptr<pstrain::Operator>>* out);
}

#endif  // PSTRAIN_NN_CUDA_CUDA_FACTORY_H_
