#include "nn/backend.h"

#include "nn/cpu/cpu_backend.h"
#ifdef PSTRAIN_WITH_CUDA
#include "nn/cuda/cuda_factory.h"
#endif

namespace pstrain {
namespace {

// The factory's table: one entry per backend this build has, keyed on the
// device type.
struct BackendEntry {
  DeviceType type;
  const char* name;
  StatusOr<std::unique_ptr<Backend>> (*create)(const BackendOptions&);
};

constexpr BackendEntry kBackends[] = {
    {DeviceType::kCpu, "cpu", &internal::CreateCpuBackend},
#ifdef PSTRAIN_WITH_CUDA
    {DeviceType::kGpu, "cuda", &internal::CreateCudaBackend},
#endif
};

}  // namespace

StatusOr<std::unique_ptr<Backend>> Backend::Create(const BackendOptions& options) {
  for (const BackendEntry& e : kBackends) {
    if (e.type == options.device.type) return e.create(options);
  }
  return Status::Unimplemented(
      StrCat("no backend for ", options.device.ToString(),
             ": this build has no CUDA backend (configure with nvcc on PATH, or "
             "-DPSTRAIN_WITH_CUDA=ON)"));
}

std::vector<std::string> Backend::Names() {
  std::vector<std::string> names;
  for (const BackendEntry& e : kBackends) names.push_back(e.name);
  return names;
}

Tensor Backend::Empty(const Shape& shape) {
  return Tensor(Allocate(static_cast<size_t>(shape.num_elements())), 0, shape);
}

Tensor Backend::Zeros(const Shape& shape) {
  Tensor t = Empty(shape);
  Fill(t, 0.0f);
  return t;
}

int GpuCount(std::string* why) {
#ifdef PSTRAIN_WITH_CUDA
  return internal::CudaDeviceCount(why);
#else
  if (why != nullptr)
    *why = "built without the CUDA backend (nvcc was not found at configure time)";
  return 0;
#endif
}

}  // namespace pstrain
