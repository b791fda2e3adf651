#include "nn/graph.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace pstrain {

const char* OpTypeName(OpType type) {
  switch (type) {
    case OpType::kInput:
      return "Input";
    case OpType::kConvolution:
      return "Convolution";
    case OpType::kPooling:
      return "Pooling";
    case OpType::kFullyConnected:
      return "FullyConnected";
    case OpType::kBatchNorm:
      return "BatchNorm";
    case OpType::kActivation:
      return "Activation";
    case OpType::kConcat:
      return "Concat";
    case OpType::kAdd:
      return "ElementWiseSum";
    case OpType::kDropout:
      return "Dropout";
    case OpType::kFlatten:
      return "Flatten";
    case OpType::kSoftmaxOutput:
      return "SoftmaxOutput";
  }
  return "?";
}

void Graph::Fail(const std::string& msg) {
  if (status_.ok()) status_ = Status::InvalidArgument(msg);
}

bool Graph::CheckInput(NodeId in, const std::string& who) {
  if (!status_.ok()) return false;
  if (in < 0 || in >= static_cast<NodeId>(nodes_.size())) {
    Fail(StrCat("node '", who, "': input node id ", in, " does not exist"));
    return false;
  }
  return true;
}

bool Graph::CheckImageInput(NodeId in, const char* kind, const std::string& name) {
  const Shape& x = nodes_[in].out_shape;
  if (x.ndim() == 3) return true;
  Fail(StrCat(kind, " '", name, "': input '", nodes_[in].name, "' has shape ", x.ToString(),
              ", expected (C,H,W)"));
  return false;
}

bool Graph::CheckKernelFits(const char* kind, const std::string& name, const Shape& x, int kh,
                            int kw, int64_t hp, int64_t wp) {
  if (hp >= kh && wp >= kw) return true;
  Fail(StrCat(kind, " '", name, "': kernel ", kh, "x", kw, " larger than the padded input ", hp,
              "x", wp, " (input ", x.ToString(), ")"));
  return false;
}

Node Graph::NewNode(OpType op, const std::string& name, std::vector<NodeId> inputs) {
  Node n;
  n.op = op;
  n.name = name;
  n.inputs = std::move(inputs);
  return n;
}

NodeId Graph::AddNode(Node node) {
  if (!status_.ok()) return kInvalidNode;
  if (Find(node.name) != kInvalidNode) {
    Fail(StrCat("duplicate node name '", node.name, "'"));
    return kInvalidNode;
  }
  node.id = static_cast<NodeId>(nodes_.size());
  for (int p : node.params) params_[p].node = node.id;
  for (int a : node.aux) aux_[a].node = node.id;
  nodes_.push_back(std::move(node));
  return nodes_.back().id;
}

int Graph::AddParam(Node* node, const std::string& suffix, Shape shape, ParamRole role) {
  params_.push_back(ParamInfo{node->name + "_" + suffix, std::move(shape), role, kInvalidNode});
  node->params.push_back(static_cast<int>(params_.size()) - 1);
  return node->params.back();
}

int Graph::AddAux(Node* node, const std::string& suffix, Shape shape, ParamRole role) {
  aux_.push_back(ParamInfo{node->name + "_" + suffix, std::move(shape), role, kInvalidNode});
  node->aux.push_back(static_cast<int>(aux_.size()) - 1);
  return node->aux.back();
}

NodeId Graph::Input(const std::string& name, const Shape& shape) {
  if (!status_.ok()) return kInvalidNode;
  // Per example: far past any memory, and far enough below where int64
  // products wrap that a batch times it does not.
  constexpr int64_t kMaxInputElements = int64_t{1} << 40;
  int64_t elements = 1;
  for (int i = 0; i < shape.ndim(); ++i) {
    if (shape[i] < 1) {
      Fail(StrCat("input '", name, "': shape ", shape.ToString(), " has a dimension < 1"));
      return kInvalidNode;
    }
    if (__builtin_mul_overflow(elements, shape[i], &elements) || elements > kMaxInputElements) {
      Fail(StrCat("input '", name, "': shape ", shape.ToString(),
                  " has more than 2^40 elements per example"));
      return kInvalidNode;
    }
  }
  Node n = NewNode(OpType::kInput, name, {});
  n.out_shape = shape;
  NodeId id = AddNode(std::move(n));
  if (id != kInvalidNode) inputs_.push_back(id);
  return id;
}

NodeId Graph::Convolution(const std::string& name, NodeId in, const ConvParam& p) {
  if (!CheckInput(in, name) || !CheckImageInput(in, "convolution", name)) return kInvalidNode;
  const Shape& x = nodes_[in].out_shape;
  if (p.num_filter < 1 || p.kernel_h < 1 || p.kernel_w < 1 || p.stride_h < 1 || p.stride_w < 1 ||
      p.pad_h < 0 || p.pad_w < 0 || p.num_group < 1 || x[0] % p.num_group != 0 ||
      p.num_filter % p.num_group != 0) {
    Fail(StrCat("convolution '", name, "': bad attributes (filters ", p.num_filter, ", groups ",
                p.num_group, ", input channels ", x[0], ")"));
    return kInvalidNode;
  }
  const int64_t hp = x[1] + 2 * p.pad_h, wp = x[2] + 2 * p.pad_w;
  if (!CheckKernelFits("convolution", name, x, p.kernel_h, p.kernel_w, hp, wp)) {
    return kInvalidNode;
  }
  Node n = NewNode(OpType::kConvolution, name, {in});
  n.conv = p;
  n.out_shape =
      Shape{p.num_filter, (hp - p.kernel_h) / p.stride_h + 1, (wp - p.kernel_w) / p.stride_w + 1};
  AddParam(&n, "weight", Shape{p.num_filter, x[0] / p.num_group, p.kernel_h, p.kernel_w},
           ParamRole::kWeight);
  if (!p.no_bias) AddParam(&n, "bias", Shape{p.num_filter}, ParamRole::kBias);
  return AddNode(std::move(n));
}

NodeId Graph::Pooling(const std::string& name, NodeId in, const PoolParam& param) {
  if (!CheckInput(in, name) || !CheckImageInput(in, "pooling", name)) return kInvalidNode;
  const Shape& x = nodes_[in].out_shape;
  PoolParam p = param;
  if (p.global) {
    p.kernel_h = static_cast<int>(x[1]);
    p.kernel_w = static_cast<int>(x[2]);
    p.stride_h = p.stride_w = 1;
    p.pad_h = p.pad_w = 0;
  }
  if (p.kernel_h < 1 || p.kernel_w < 1 || p.stride_h < 1 || p.stride_w < 1 || p.pad_h < 0 ||
      p.pad_w < 0 || p.pad_h >= p.kernel_h || p.pad_w >= p.kernel_w) {
    Fail(StrCat("pooling '", name, "': bad kernel/stride/pad"));
    return kInvalidNode;
  }
  const int64_t hp = x[1] + 2 * p.pad_h, wp = x[2] + 2 * p.pad_w;
  if (!CheckKernelFits("pooling", name, x, p.kernel_h, p.kernel_w, hp, wp)) return kInvalidNode;
  int64_t oh, ow;
  if (p.convention == PoolConvention::kValid) {
    oh = (hp - p.kernel_h) / p.stride_h + 1;
    ow = (wp - p.kernel_w) / p.stride_w + 1;
  } else {
    oh = std::min(hp - p.kernel_h + p.stride_h - 1, hp - 1) / p.stride_h + 1;
    ow = std::min(wp - p.kernel_w + p.stride_w - 1, wp - 1) / p.stride_w + 1;
  }
  Node n = NewNode(OpType::kPooling, name, {in});
  n.pool = p;
  n.out_shape = Shape{x[0], oh, ow};
  return AddNode(std::move(n));
}

NodeId Graph::FullyConnected(const std::string& name, NodeId in, const FcParam& p) {
  if (!CheckInput(in, name)) return kInvalidNode;
  if (p.num_hidden < 1) {
    Fail(StrCat("fully connected '", name, "': num_hidden must be >= 1"));
    return kInvalidNode;
  }
  Node n = NewNode(OpType::kFullyConnected, name, {in});
  n.fc = p;
  n.out_shape = Shape{p.num_hidden};
  AddParam(&n, "weight", Shape{p.num_hidden, nodes_[in].out_shape.num_elements()},
           ParamRole::kWeight);
  if (!p.no_bias) AddParam(&n, "bias", Shape{p.num_hidden}, ParamRole::kBias);
  return AddNode(std::move(n));
}

NodeId Graph::BatchNorm(const std::string& name, NodeId in, const BatchNormParam& p) {
  if (!CheckInput(in, name)) return kInvalidNode;
  const Shape& x = nodes_[in].out_shape;
  // Written so that NaN fails too.
  if (x.ndim() < 1 || !(p.eps > 0) || !(p.momentum >= 0 && p.momentum <= 1)) {
    Fail(StrCat("batch norm '", name, "': needs a channel dimension, eps > 0, momentum in [0,1]"));
    return kInvalidNode;
  }
  Node n = NewNode(OpType::kBatchNorm, name, {in});
  n.bn = p;
  n.out_shape = x;
  AddParam(&n, "gamma", Shape{x[0]}, ParamRole::kGamma);
  AddParam(&n, "beta", Shape{x[0]}, ParamRole::kBeta);
  AddAux(&n, "moving_mean", Shape{x[0]}, ParamRole::kMovingMean);
  AddAux(&n, "moving_var", Shape{x[0]}, ParamRole::kMovingVar);
  return AddNode(std::move(n));
}

NodeId Graph::Activation(const std::string& name, NodeId in, ActType type) {
  if (!CheckInput(in, name)) return kInvalidNode;
  Node n = NewNode(OpType::kActivation, name, {in});
  n.act = type;
  n.out_shape = nodes_[in].out_shape;
  return AddNode(std::move(n));
}

NodeId Graph::Concat(const std::string& name, const std::vector<NodeId>& ins) {
  if (ins.empty()) {
    Fail(StrCat("concat '", name, "': no inputs"));
    return kInvalidNode;
  }
  for (NodeId in : ins) {
    if (!CheckInput(in, name)) return kInvalidNode;
  }
  Shape out = nodes_[ins[0]].out_shape;
  if (out.ndim() < 1) {
    Fail(StrCat("concat '", name, "': inputs need a channel dimension"));
    return kInvalidNode;
  }
  for (size_t i = 1; i < ins.size(); ++i) {
    const Shape& s = nodes_[ins[i]].out_shape;
    bool same = s.ndim() == out.ndim();
    for (int d = 1; same && d < s.ndim(); ++d) same = s[d] == out[d];
    if (!same) {
      Fail(StrCat("concat '", name, "': input '", nodes_[ins[i]].name, "' has shape ", s.ToString(),
                  ", incompatible with '", nodes_[ins[0]].name, "' ",
                  nodes_[ins[0]].out_shape.ToString()));
      return kInvalidNode;
    }
    out[0] += s[0];
  }
  Node n = NewNode(OpType::kConcat, name, ins);
  n.out_shape = out;
  return AddNode(std::move(n));
}

NodeId Graph::Add(const std::string& name, const std::vector<NodeId>& ins) {
  if (ins.empty()) {
    Fail(StrCat("add '", name, "': no inputs"));
    return kInvalidNode;
  }
  for (NodeId in : ins) {
    if (!CheckInput(in, name)) return kInvalidNode;
    if (nodes_[in].out_shape != nodes_[ins[0]].out_shape) {
      Fail(StrCat("add '", name, "': input '", nodes_[in].name, "' has shape ",
                  nodes_[in].out_shape.ToString(), ", expected ",
                  nodes_[ins[0]].out_shape.ToString()));
      return kInvalidNode;
    }
  }
  Node n = NewNode(OpType::kAdd, name, ins);
  n.out_shape = nodes_[ins[0]].out_shape;
  return AddNode(std::move(n));
}

NodeId Graph::Dropout(const std::string& name, NodeId in, const DropoutParam& p) {
  if (!CheckInput(in, name)) return kInvalidNode;
  if (!(p.p >= 0.0f && p.p < 1.0f)) {
    Fail(StrCat("dropout '", name, "': p must be in [0, 1), got ", p.p));
    return kInvalidNode;
  }
  Node n = NewNode(OpType::kDropout, name, {in});
  n.dropout = p;
  n.out_shape = nodes_[in].out_shape;
  return AddNode(std::move(n));
}

NodeId Graph::Flatten(const std::string& name, NodeId in) {
  if (!CheckInput(in, name)) return kInvalidNode;
  Node n = NewNode(OpType::kFlatten, name, {in});
  n.out_shape = Shape{nodes_[in].out_shape.num_elements()};
  return AddNode(std::move(n));
}

NodeId Graph::SoftmaxOutput(const std::string& name, NodeId in, float grad_scale) {
  if (!CheckInput(in, name)) return kInvalidNode;
  if (!std::isfinite(grad_scale)) {
    Fail(StrCat("softmax output '", name, "': grad_scale ", grad_scale, " is not a finite number"));
    return kInvalidNode;
  }
  NodeId label = Input(name + "_label", Shape{});
  if (label == kInvalidNode) return kInvalidNode;
  Node n = NewNode(OpType::kSoftmaxOutput, name, {in, label});
  n.out_shape = Shape{nodes_[in].out_shape.num_elements()};
  n.softmax_grad_scale = grad_scale;
  return AddNode(std::move(n));
}

NodeId Graph::Find(const std::string& name) const {
  for (const Node& n : nodes_) {
    if (n.name == name) return n.id;
  }
  return kInvalidNode;
}

int64_t Graph::NumParams() const {
  int64_t total = 0;
  for (const ParamInfo& p : params_) total += p.shape.num_elements();
  return total;
}

int64_t Graph::NumAuxElements() const {
  int64_t total = 0;
  for (const ParamInfo& p : aux_) total += p.shape.num_elements();
  return total;
}

double Graph::ForwardFlops(NodeId id) const {
  const Node& n = nodes_[id];
  const double out = static_cast<double>(n.out_shape.num_elements());
  auto in = [&](int k) {
    return static_cast<double>(nodes_[n.inputs[k]].out_shape.num_elements());
  };
  switch (n.op) {
    case OpType::kConvolution: {
      const Shape& x = nodes_[n.inputs[0]].out_shape;
      return 2.0 * out * static_cast<double>(x[0] / n.conv.num_group) * n.conv.kernel_h *
             n.conv.kernel_w;
    }
    case OpType::kFullyConnected:
      return 2.0 * out * in(0);
    case OpType::kPooling:
      return out * n.pool.kernel_h * n.pool.kernel_w;
    case OpType::kBatchNorm:
      return 5.0 * out;
    case OpType::kActivation:
      return (n.act == ActType::kRelu ? 1.0 : 4.0) * out;
    case OpType::kAdd:
      return out * static_cast<double>(n.inputs.size() - 1);
    case OpType::kDropout:
      return 2.0 * out;
    case OpType::kSoftmaxOutput:
      return 4.0 * in(0);
    case OpType::kInput:
    case OpType::kConcat:
    case OpType::kFlatten:
      return 0;
  }
  return 0;
}

std::vector<bool> Graph::NodesWithBackward() const {
  const int count = static_cast<int>(nodes_.size());
  std::vector<bool> reaches_loss(count, false), needs_grad(count, false);
  NodeId loss = kInvalidNode;
  for (const Node& n : nodes_) {
    if (n.op == OpType::kSoftmaxOutput) loss = n.id;
  }
  if (loss == kInvalidNode) return needs_grad;
  reaches_loss[loss] = true;
  for (int i = count - 1; i >= 0; --i) {
    if (!reaches_loss[i]) continue;
    for (NodeId in : nodes_[i].inputs) reaches_loss[in] = true;
  }
  for (int i = 0; i < count; ++i) {
    if (nodes_[i].op == OpType::kInput || !reaches_loss[i]) continue;
    bool g = !nodes_[i].params.empty();
    for (NodeId in : nodes_[i].inputs) g = g || needs_grad[in];
    needs_grad[i] = g;
  }
  return needs_grad;
}

std::vector<LayerSummary> Graph::Summary() const {
  std::vector<LayerSummary> rows;
  for (const Node& n : nodes_) {
    if (n.op == OpType::kInput) continue;
    LayerSummary row{n.name, OpTypeName(n.op), n.out_shape, 0};
    for (int p : n.params) row.num_params += params_[p].shape.num_elements();
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace pstrain
