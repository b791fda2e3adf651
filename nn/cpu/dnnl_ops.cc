#include "nn/cpu/cpu_ops.h"

namespace pstrain::internal {

std::unique_ptr<Operator> MakeDnnlOperator(const Node& node) { return nullptr; }

}  // namespace pstrain::internal
