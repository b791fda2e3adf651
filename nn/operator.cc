#include "nn/operator.h"

namespace pstrain {

Status Operator::Setup(const OpContext& ctx, const OpTensors& t) {
  const std::string where = StrCat(OpTypeName(node_.op), " '", node_.name, "'");
  CHECK(ctx.backend != nullptr) << where << ": Setup without a backend";
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
  const Device device = ctx.device();
  auto on_device = [&](const Tensor& x, const std::string& what) {
    if (!x.defined() || x.device() == device) return Status::Ok();
    return Status::InvalidArgument(StrCat(where, ": ", what, " on ", x.device().ToString(),
                                          ", operator on ", device.ToString()));
  };
  for (size_t i = 0; i < t.in.size(); ++i) {
    RETURN_IF_ERROR(on_device(t.in[i], StrCat("input ", i)));
    if (i < t.in_grads.size())
      RETURN_IF_ERROR(on_device(t.in_grads[i], StrCat("input gradient ", i)));
  }
  RETURN_IF_ERROR(on_device(t.out, "output"));
  RETURN_IF_ERROR(on_device(t.out_grad, "output gradient"));
  for (size_t i = 0; i < t.params.size(); ++i) {
    RETURN_IF_ERROR(on_device(t.params[i], StrCat("parameter ", i)));
    if (i < t.param_grads.size()) {
      RETURN_IF_ERROR(on_device(t.param_grads[i], StrCat("parameter gradient ", i)));
    }
  }
  for (size_t i = 0; i < t.aux.size(); ++i) RETURN_IF_ERROR(on_device(t.aux[i], StrCat("aux ", i)));
  t_ = t;
  t_.in_grads.resize(t_.in.size());
  return DoSetup(ctx);
}

}  // namespace pstrain
