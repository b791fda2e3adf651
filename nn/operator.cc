#include "nn/operator.h"

#include "nn/cpu/cpu_ops.h"

namespace pstrain {

StatusOr<std::unique_ptr<Operator>> Operator::Create(const Node& node, CpuKernels kernels) {
  if (node.op == OpType::kInput) {
    return Status::InvalidArgument(StrCat("node '", node.name, "' is an input, not an operator"));
  }
  std::unique_ptr<Operator> op;
  if (kernels == CpuKernels::kOneDnn) op = internal::MakeDnnlOperator(node);
  if (op == nullptr) op = internal::MakeReferenceOperator(node);
  if (op == nullptr) {
    return Status::InvalidArgument(
        StrCat("node '", node.name, "': no operator for type ", static_cast<int>(node.op)));
  }
  return op;
}

Status Operator::Setup(const OpContext& ctx, const OpTensors& t) {
  const std::string where = StrCat(OpTypeName(node_.op), " '", node_.name, "'");
  if (t.in.size() != node_.inputs.size() || t.params.size() != node_.params.size() ||
      t.aux.size() != node_.aux.size()) {
    return Status::InvalidArgument(StrCat(
        where, ": expected ", node_.inputs.size(), " inputs, ", node_.params.size(), " params, ",
        node_.aux.size(), " aux; got ", t.in.size(), ", ", t.params.size(), ", ", t.aux.size()));
  }
  if (!t.out.defined() || t.out.shape().ndim() < 1 ||
      t.out.shape().WithoutBatch() != node_.out_shape) {
    return Status::InvalidArgument(StrCat(where, ": output must be batch x ",
                                          node_.out_shape.ToString(), ", got ",
                                          t.out.shape().ToString()));
  }
  const int64_t batch = t.out.shape()[0];
  for (size_t i = 0; i < t.in.size(); ++i) {
    if (!t.in[i].defined() || t.in[i].shape().ndim() < 1 || t.in[i].shape()[0] != batch) {
      return Status::InvalidArgument(StrCat(where, ": input ", i, " has shape ",
                                            t.in[i].shape().ToString(), ", batch ", batch,
                                            " expected"));
    }
    if (i < t.in_grads.size() && t.in_grads[i].defined() &&
        t.in_grads[i].shape() != t.in[i].shape()) {
      return Status::InvalidArgument(StrCat(where, ": input gradient ", i, " shape mismatch"));
    }
  }
  if (t.out_grad.defined() && t.out_grad.shape() != t.out.shape()) {
    return Status::InvalidArgument(StrCat(where, ": output gradient shape mismatch"));
  }
  if (!t.param_grads.empty() && t.param_grads.size() != t.params.size()) {
    return Status::InvalidArgument(StrCat(where, ": param_grads must match params"));
  }
  for (const Tensor& x : t.in) {
    if (x.device() != ctx.device) {
      return Status::InvalidArgument(StrCat(where, ": input on ", x.device().ToString(),
                                            ", operator on ", ctx.device.ToString()));
    }
  }
  t_ = t;
  t_.in_grads.resize(t_.in.size());
  if (ctx.device.is_cpu()) return SetupCpu(ctx);
  return SetupGpu(ctx);
}

void Operator::Forward(const OpContext& ctx) {
  if (ctx.device.is_cpu()) {
    ForwardCpu(ctx);
  } else {
    ForwardGpu(ctx);
  }
}

void Operator::Backward(const OpContext& ctx) {
  if (ctx.device.is_cpu()) {
    BackwardCpu(ctx);
  } else {
    BackwardGpu(ctx);
  }
}

Status Operator::SetupGpu(const OpContext& ctx) {
  return Status::Unimplemented(StrCat("no GPU kernel for ", OpTypeName(node_.op), " '", node_.name,
                                      "' on ", ctx.device.ToString(),
                                      " (this build has no CUDA backend)"));
}

void Operator::ForwardGpu(const OpContext& ctx) {
  LOG(FATAL) << "no GPU forward kernel for " << OpTypeName(node_.op) << " '" << node_.name << "'";
}

void Operator::BackwardGpu(const OpContext& ctx) {
  LOG(FATAL) << "no GPU backward kernel for " << OpTypeName(node_.op) << " '" << node_.name << "'";
}

}  // namespace pstrain
