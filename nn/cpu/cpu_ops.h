// Factories of the CPU operator implementations (internal to nn/).
#ifndef PSTRAIN_NN_CPU_CPU_OPS_H_
#define PSTRAIN_NN_CPU_CPU_OPS_H_

#include <memory>

#include "nn/graph.h"
#include "nn/operator.h"

namespace pstrain::internal {

// The plain-loop reference operator for `node` (every op type but kInput);
// nullptr for kInput.
std::unique_ptr<Operator> MakeReferenceOperator(const Node& node);

// The oneDNN operator for `node`, or nullptr when oneDNN does not cover it
// (the caller then uses the reference loops, which are the only CPU kernel for
// concat, add, dropout, flatten and softmax and are parallel where it pays).
std::unique_ptr<Operator> MakeDnnlOperator(const Node& node);

}  // namespace pstrain::internal

#endif  // PSTRAIN_NN_CPU_CPU_OPS_H_
