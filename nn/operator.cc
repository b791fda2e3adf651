#include "nn/operator.h"

namespace pstrain {

OpShapes OpShapes::Of(const OpTensors& t) {
  OpShapes s;
  for (const Tensor& x : t.in) s.in.push_back(x.shape());
  s.out = t.out.shape();
  for (const Tensor& p : t.params) s.params.push_back(p.shape());
  s.out_grad = t.out_grad.defined();
  s.param_grads = !t.param_grads.empty();
  for (size_t i = 0; i < t.in.size(); ++i) {
    s.in_grads.push_back(i < t.in_grads.size() && t.in_grads[i].defined());
    s.in_grad_add.push_back(i < t.in_grad_add.size() && t.in_grad_add[i]);
  }
  return s;
}

std::string OpShapes::ToString() const {
  std::string r = "in";
  for (size_t i = 0; i < in.size(); ++i) {
    r += StrCat(" ", in[i].ToString(), i < in_grads.size() && in_grads[i] ? "+grad" : "",
                i < in_grad_add.size() && in_grad_add[i] ? " (added to)" : "");
  }
  r += StrCat(", out ", out.ToString(), out_grad ? "+grad" : "", ", params");
  for (const Shape& p : params) r += StrCat(" ", p.ToString(), param_grads ? "+grad" : "");
  return r;
}

void Operator::LearnInputShapes(const Graph& graph) {
  std::vector<Shape> in;
  in.reserve(node_.inputs.size());
  for (NodeId i : node_.inputs) in.push_back(graph.node(i).out_shape);
  DoLearnInputShapes(in);
}

StatusOr<ScratchNeeds> Operator::PlanScratch(const OpContext& ctx, const OpShapes& shapes) {
  CHECK(!planned_) << OpTypeName(node_.op) << " '" << node_.name << "': PlanScratch twice";
  CHECK(ctx.backend != nullptr) << node_.name << ": PlanScratch without a backend";
  shapes_ = shapes;
  planned_ = true;
  ASSIGN_OR_RETURN(needs_, DoPlanScratch(ctx));
  return needs_;
}

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
  RETURN_IF_ERROR(on_device(t.scratch_forward, "forward scratch"));
  RETURN_IF_ERROR(on_device(t.scratch_backward, "backward scratch"));
  if (t.in_grad_add.size() > t.in.size()) {
    return Status::InvalidArgument(StrCat(where, ": ", t.in_grad_add.size(),
                                          " input-gradient add flags for ", t.in.size(),
                                          " inputs"));
  }
  for (size_t i = 0; i < t.in_grad_add.size(); ++i) {
    if (!t.in_grad_add[i]) continue;
    if (i >= t.in_grads.size() || !t.in_grads[i].defined()) {
      return Status::InvalidArgument(
          StrCat(where, ": input gradient ", i, " is to be added to but is not bound"));
    }
    if (!CanAddToInputGradient(i)) {
      return Status::InvalidArgument(
          StrCat(where, ": cannot add to input gradient ", i, " (it only overwrites)"));
    }
  }
  t_ = t;
  t_.in_grads.resize(t_.in.size());
  t_.in_grad_add.resize(t_.in.size(), false);
  const OpShapes bound = OpShapes::Of(t_);
  if (!planned_) {
    RETURN_IF_ERROR(PlanScratch(ctx, bound).status().WithContext(where));
  } else if (!(bound == shapes_)) {
    return Status::InvalidArgument(StrCat(where, ": bound as (", bound.ToString(),
                                          ") but planned as (", shapes_.ToString(), ")"));
  }
  // Scratch: the binding's, at least as large as planned, or our own.
  auto scratch = [&](Tensor* s, size_t need, const char* what) {
    if (need == 0) return Status::Ok();
    if (!s->defined()) {
      *s = ctx.backend->Empty(
          Shape{static_cast<int64_t>((need + sizeof(float) - 1) / sizeof(float))});
    } else if (s->bytes() < need) {
      return Status::InvalidArgument(
          StrCat(where, ": ", what, " scratch of ", s->bytes(), " bytes, ", need, " needed"));
    }
    return Status::Ok();
  };
  RETURN_IF_ERROR(scratch(&t_.scratch_forward, needs_.forward_bytes, "forward"));
  RETURN_IF_ERROR(scratch(&t_.scratch_backward, needs_.backward_bytes, "backward"));
  return DoSetup(ctx);
}

}  // namespace pstrain
