// One check macro per foreign GPU library (style.md habit 4): the expression
// is evaluated once, and a failure names the call, the library's own error
// string, and where. CHECK-style: a failing CUDA, cuDNN or cuBLAS call inside a
// step is a broken device or a bug of ours, not bad input. Setup paths that
// can fail for reasons a user can fix (no device, out of memory) return a
// Status built by CudaError / CudnnError instead.
#ifndef PSTRAIN_NN_CUDA_CUDA_CHECK_H_
#define PSTRAIN_NN_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <glog/logging.h>

#include <string>

#include "common/status.h"

namespace pstrain::internal {

// cuBLAS has no error-string call for every version we build with.
const char* CublasStatusName(cublasStatus_t s);

inline Status CudaError(cudaError_t e, const std::string& what) {
  return Status::Unavailable(StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}
inline Status CudnnError(cudnnStatus_t e, const std::string& what) {
  return Status::Unavailable(StrCat(what, ": ", cudnnGetErrorString(e)));
}

}  // namespace pstrain::internal

#define PSTRAIN_CUDA_CHECK(expr)                                                               \
  do {                                                                                         \
    const cudaError_t pstrain_e_ = (expr);                                                     \
    CHECK_EQ(pstrain_e_, cudaSuccess) << #expr << ": " << cudaGetErrorName(pstrain_e_) << ": " \
                                      << cudaGetErrorString(pstrain_e_);                       \
  } while (0)

#define PSTRAIN_CUDNN_CHECK(expr)                            \
  do {                                                       \
    const cudnnStatus_t pstrain_s_ = (expr);                 \
    CHECK_EQ(pstrain_s_, CUDNN_STATUS_SUCCESS)               \
        << #expr << ": " << cudnnGetErrorString(pstrain_s_); \
  } while (0)

#define PSTRAIN_CUBLAS_CHECK(expr)                                             \
  do {                                                                         \
    const cublasStatus_t pstrain_b_ = (expr);                                  \
    CHECK_EQ(pstrain_b_, CUBLAS_STATUS_SUCCESS)                                \
        << #expr << ": " << ::pstrain::internal::CublasStatusName(pstrain_b_); \
  } while (0)

// A kernel launch: the launch error (bad configuration) right away.
#define PSTRAIN_CUDA_CHECK_LAUNCH() PSTRAIN_CUDA_CHECK(cudaGetLastError())

// A release (cudaFree, cudaFreeHost) checked as PSTRAIN_CUDA_CHECK, except
// that a runtime already unloading (a tensor or pinned buffer dropped during
// the process's static destruction) is no error: the memory goes with the
// process.
#define PSTRAIN_CUDA_CHECK_RELEASE(expr)                                       \
  do {                                                                         \
    const cudaError_t pstrain_e_ = (expr);                                     \
    CHECK(pstrain_e_ == cudaSuccess || pstrain_e_ == cudaErrorCudartUnloading) \
        << #expr << ": " << cudaGetErrorName(pstrain_e_) << ": "               \
        << cudaGetErrorString(pstrain_e_);                                     \
  } while (0)

// Setup paths: return a Status from the enclosing function on failure.
#define PSTRAIN_CUDA_RETURN_IF_ERROR(expr, what)                                            \
  do {                                                                                      \
    const cudaError_t pstrain_e_ = (expr);                                                  \
    if (pstrain_e_ != cudaSuccess) return ::pstrain::internal::CudaError(pstrain_e_, what); \
  } while (0)
#define PSTRAIN_CUDNN_RETURN_IF_ERROR(expr, what)               \
  do {                                                          \
    const cudnnStatus_t pstrain_s_ = (expr);                    \
    if (pstrain_s_ != CUDNN_STATUS_SUCCESS)                     \
      return ::pstrain::internal::CudnnError(pstrain_s_, what); \
  } while (0)

#endif  // PSTRAIN_NN_CUDA_CUDA_CHECK_H_
