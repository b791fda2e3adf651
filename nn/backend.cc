#include "nn/backend.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "nn/cpu/cpu_backend.h"
#include "nn/operator.h"
#ifdef PSTRAIN_WITH_CUDA
#include <dlfcn.h>
#include <unistd.h>

#include <cstring>
#include <optional>

#include "common/env.h"
#include "nn/cuda/cuda_factory.h"
#endif

namespace pstrain {
namespace {

#ifdef PSTRAIN_WITH_CUDA

// The CUDA backend module (nn/cuda/cuda_factory.h), loaded once per process
// on first use and never unloaded (its code runs the destructors of the
// tensors it made). Where it is looked for, in order: $PSTRAIN_CUDA_MODULE (a
// file), beside the running binary, one folder up (build/tests, build/bench),
// and the build tree it came from.
class CudaModule {
 public:
  static const CudaModule& Get() {
    static const CudaModule* module = new CudaModule();  // lives as long as the process
    return *module;
  }
  bool loaded() const { return create_ != nullptr; }
  const std::string& error() const { return error_; }

  StatusOr<std::unique_ptr<Backend>> Create(const BackendOptions& o) const {
    StatusOr<std::unique_ptr<Backend>> out(Status::Internal("the CUDA module made no backend"));
    create_(o, &out);
    return out;
  }
  int DeviceCount(std::string* why) const { return count_(why); }
  StatusOr<std::unique_ptr<Operator>> MakeOperator(const Node& node) const {
    StatusOr<std::unique_ptr<Operator>> out(Status::Internal("the CUDA module made no operator"));
    make_op_(node, &out);
    return out;
  }

 private:
  CudaModule() {
    std::vector<std::string> candidates;
    if (std::optional<std::string> path = Environment().Get("PSTRAIN_CUDA_MODULE")) {
      candidates.push_back(*path);
    } else {
      char self[4096];
      const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
      if (n > 0) {
        std::string dir(self, static_cast<size_t>(n));
        dir = dir.substr(0, dir.rfind('/'));
        candidates.push_back(dir + "/libpstrain_cuda.so");
        candidates.push_back(dir.substr(0, dir.rfind('/')) + "/libpstrain_cuda.so");
      }
      candidates.push_back(std::string(PSTRAIN_CUDA_MODULE_DIR) + "/libpstrain_cuda.so");
    }
    std::string tried;
    for (const std::string& path : candidates) {
      if (access(path.c_str(), F_OK) != 0) {
        tried += StrCat(tried.empty() ? "" : ", ", path, " (absent)");
        continue;
      }
      void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (h == nullptr) {
        error_ = StrCat("cannot load the CUDA backend ", path, ": ", dlerror());
        return;
      }
      auto abi_fn = reinterpret_cast<void (*)(internal::CudaModuleAbi*, size_t)>(
          dlsym(h, "PstrainCudaModuleAbi"));
      create_ = reinterpret_cast<CreateFn>(dlsym(h, "PstrainCreateCudaBackend"));
      count_ = reinterpret_cast<CountFn>(dlsym(h, "PstrainCudaDeviceCount"));
      make_op_ = reinterpret_cast<MakeOpFn>(dlsym(h, "PstrainMakeCudaOperator"));
      // Room to spare: a module of another ABI may write a larger struct
      // (ABI 6 and older ignore the room given); only `version` is read
      // before it is known to be ours.
      alignas(internal::CudaModuleAbi) unsigned char room[4096] = {};
      const int unknown = -1;
      std::memcpy(room, &unknown, sizeof(unknown));
      if (abi_fn != nullptr) {
        abi_fn(reinterpret_cast<internal::CudaModuleAbi*>(room), sizeof(room));
      }
      internal::CudaModuleAbi abi;
      std::memcpy(&abi.version, room, sizeof(abi.version));
      if (abi.version == internal::kCudaModuleAbi) std::memcpy(&abi, room, sizeof(abi));
      if (create_ == nullptr || count_ == nullptr || make_op_ == nullptr ||
          !(abi == internal::CudaModuleAbi())) {
        create_ = nullptr;
        count_ = nullptr;
        make_op_ = nullptr;
        error_ =
            StrCat("the CUDA backend ", path, " is from another build (ABI ", abi.version,
                   ", this binary's ", internal::kCudaModuleAbi, "): rebuild it with this one");
        return;
      }
      return;
    }
    error_ = StrCat("the CUDA backend module libpstrain_cuda.so was not found (tried ", tried,
                    "; set PSTRAIN_CUDA_MODULE to its path)");
  }

  using CreateFn = void (*)(const BackendOptions&, StatusOr<std::unique_ptr<Backend>>*);
  using CountFn = int (*)(std::string*);
  using MakeOpFn = void (*)(const Node&, StatusOr<std::unique_ptr<Operator>>*);
  CreateFn create_ = nullptr;
  CountFn count_ = nullptr;
  MakeOpFn make_op_ = nullptr;
  std::string error_;
};

StatusOr<std::unique_ptr<Backend>> LoadCudaBackend(const BackendOptions& options) {
  const CudaModule& m = CudaModule::Get();
  if (!m.loaded()) {
    return Status::Unavailable(
        StrCat("no backend for ", options.device.ToString(), ": ", m.error()));
  }
  return m.Create(options);
}

#endif  // PSTRAIN_WITH_CUDA

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
    {DeviceType::kGpu, "cuda", &LoadCudaBackend},
#endif
};

}  // namespace

StatusOr<std::vector<std::unique_ptr<Operator>>> Backend::CreateOperatorsWithoutDevice(
    const BackendOptions& options, const Graph& graph) {
  std::function<StatusOr<std::unique_ptr<Operator>>(const Node&)> make;
  std::unique_ptr<Backend> cpu;
  if (options.device.is_cpu()) {
    // (The CPU's operators keep no reference to the backend before Setup.)
    ASSIGN_OR_RETURN(cpu, Create(options));
    make = [&cpu](const Node& node) { return cpu->CreateOperator(node); };
  } else {
#ifdef PSTRAIN_WITH_CUDA
    const CudaModule& m = CudaModule::Get();
    if (!m.loaded()) {
      return Status::Unavailable(
          StrCat("no operators for ", options.device.ToString(), ": ", m.error()));
    }
    make = [&m](const Node& node) { return m.MakeOperator(node); };
#else
    return Status::Unimplemented(
        StrCat("no operators for ", options.device.ToString(),
               ": this build has no CUDA backend (configure with nvcc on PATH, or "
               "-DPSTRAIN_WITH_CUDA=ON)"));
#endif
  }
  std::vector<std::unique_ptr<Operator>> ops(graph.nodes().size());
  for (const Node& node : graph.nodes()) {
    if (node.op == OpType::kInput) continue;
    ASSIGN_OR_RETURN(ops[node.id], make(node));
    ops[node.id]->LearnInputShapes(graph);
  }
  return ops;
}

StatusOr<std::vector<Tensor>> Backend::TryZerosPacked(const std::vector<Shape>& shapes) {
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const Shape& s : shapes) {
    offsets.push_back(total);
    total += (s.num_elements() + kTensorAlignFloats - 1) / kTensorAlignFloats * kTensorAlignFloats;
  }
  std::vector<Tensor> out;
  if (shapes.empty()) return out;
  ASSIGN_OR_RETURN(const Tensor all, TryZeros(Shape{std::max<int64_t>(total, 1)}));
  for (size_t i = 0; i < shapes.size(); ++i) {
    out.emplace_back(all.buffer(), static_cast<size_t>(offsets[i]), shapes[i]);
  }
  return out;
}

std::vector<Tensor> Backend::ZerosPacked(const std::vector<Shape>& shapes) {
  StatusOr<std::vector<Tensor>> t = TryZerosPacked(shapes);
  CHECK(t.ok()) << t.status();
  return std::move(t).value();
}

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

int GpuCount(std::string* why) {
#ifdef PSTRAIN_WITH_CUDA
  const CudaModule& m = CudaModule::Get();
  if (!m.loaded()) {
    if (why != nullptr) *why = m.error();
    return 0;
  }
  return m.DeviceCount(why);
#else
  if (why != nullptr)
    *why = "built without the CUDA backend (nvcc was not found at configure time)";
  return 0;
#endif
}

}  // namespace pstrain
