// The oneDNN engine and stream one executor's CPU operators share (internal).
#ifndef PSTRAIN_NN_CPU_CPU_ENGINE_H_
#define PSTRAIN_NN_CPU_CPU_ENGINE_H_

#include <oneapi/dnnl/dnnl.hpp>

namespace pstrain {

class CpuEngine {
 public:
  CpuEngine() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
  dnnl::engine& engine() { return engine_; }
  dnnl::stream& stream() { return stream_; }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_CPU_CPU_ENGINE_H_
