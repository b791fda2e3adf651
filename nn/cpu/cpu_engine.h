// The oneDNN engine and stream one executor's CPU operators share (internal).
#ifndef PSTRAIN_NN_CPU_CPU_ENGINE_H_
#define PSTRAIN_NN_CPU_CPU_ENGINE_H_

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>

namespace pstrain {

class CpuEngine {
 public:
  CpuEngine() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }
  // Reorders run so far (Backend::counters()).
  int64_t activation_reorders = 0;
  int64_t param_reorders = 0;

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_CPU_CPU_ENGINE_H_
