// The entry points of libpstrain_cuda.so (nn/cuda/cuda_factory.h).
#include "nn/cuda/cuda_backend.h"
#include "nn/cuda/cuda_factory.h"

#define PSTRAIN_MODULE_EXPORT __attribute__((visibility("default")))

extern "C" {

PSTRAIN_MODULE_EXPORT void PstrainCudaModuleAbi(pstrain::internal::CudaModuleAbi* abi,
                                                size_t room) {
  if (room >= sizeof(pstrain::internal::CudaModuleAbi)) {
    *abi = pstrain::internal::CudaModuleAbi();
  } else {
    abi->version = pstrain::internal::kCudaModuleAbi;
  }
}

PSTRAIN_MODULE_EXPORT void PstrainCreateCudaBackend(
    const pstrain::BackendOptions& options,
    pstrain::StatusOr<std::unique_ptr<pstrain::Backend>>* out) {
  *out = pstrain::internal::CreateCudaBackend(options);
}

PSTRAIN_MODULE_EXPORT int PstrainCudaDeviceCount(std::string* why) {
  return pstrain::internal::CudaDeviceCount(why);
}

PSTRAIN_MODULE_EXPORT void PstrainMakeCudaOperator(
    const pstrain::Node& node, pstrain::StatusOr<std::unique_ptr<pstrain::Operator>>* out) {
  *out = pstrain::internal::MakeCudaOperator(node);
}

}  // extern "C"
