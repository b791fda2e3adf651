// The CUDA backend's entry points for the backend factory (nn/backend.cc).
// Plain C++: nothing here needs the CUDA headers, so the factory compiles the
// same way with and without the CUDA backend.
#ifndef PSTRAIN_NN_CUDA_CUDA_FACTORY_H_
#define PSTRAIN_NN_CUDA_CUDA_FACTORY_H_

#include <memory>
#include <string>

#include "nn/backend.h"

namespace pstrain::internal {

// InvalidArgument for an ordinal with no GPU; Unavailable when the driver or
// the device fails (the CUDA error string in the message).
StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const BackendOptions& options);
// GPUs the driver shows this process; 0 and the reason in *why when none.
int CudaDeviceCount(std::string* why);

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CUDA_CUDA_FACTORY_H_
