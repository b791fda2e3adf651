// Graph: a static network built by C++ builders (models/), MXNet-style.
//
// Each builder call adds one node (an operator with its attributes), infers its
// per-sample output shape (the batch dimension is added by the Executor), and
// creates the node's parameters with MXNet's names, in creation order:
//
//   g.Convolution("conv1", x, {...})  -> conv1_weight (F, C/group, kh, kw), conv1_bias (F)
//   g.FullyConnected("fc1", x, {...}) -> fc1_weight (H, in_features), fc1_bias (H)
//   g.BatchNorm("bn1", x, {...})      -> bn1_gamma (C), bn1_beta (C);
//                                        aux bn1_moving_mean (C), bn1_moving_var (C)
//
// The parameter order is the KV key order the worker pushes and pulls.
//
// Errors: a builder call whose input is invalid (shapes that do not fit, a
// kernel larger than the padded input, an unknown node) records the first error
// and returns kInvalidNode; later calls that use kInvalidNode are no-ops. Check
// status() once after building (BuildModel does). Thread safety: none needed; a
// Graph is built by one thread and is read-only afterwards.
#ifndef PSTRAIN_NN_GRAPH_H_
#define PSTRAIN_NN_GRAPH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "nn/tensor.h"

namespace pstrain {

using NodeId = int;
inline constexpr NodeId kInvalidNode = -1;

enum class OpType {
  kInput,
  kConvolution,
  kPooling,
  kFullyConnected,
  kBatchNorm,
  kActivation,
  kConcat,
  kAdd,
  kDropout,
  kFlatten,
  kSoftmaxOutput,
};
// "Convolution", "Pooling", ... (MXNet's operator names).
const char* OpTypeName(OpType type);

struct ConvParam {
  int num_filter = 0;
  int kernel_h = 1, kernel_w = 1;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  int num_group = 1;
  bool no_bias = false;
};

enum class PoolType { kMax, kAvg };
// kValid: floor((H + 2p - k) / s) + 1 (MXNet 1.x default).
// kFull:  MXNet 2015 rounding, min(H + 2p - k + s - 1, H + 2p - 1) / s + 1, i.e. ceil
//         but the last window must start inside the (padded) input.
enum class PoolConvention { kValid, kFull };

struct PoolParam {
  PoolType type = PoolType::kMax;
  int kernel_h = 2, kernel_w = 2;
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  bool global = false;  // kernel = the whole input plane, stride 1, pad 0
  PoolConvention convention = PoolConvention::kValid;
  // Average pooling divides by the window size including padding (MXNet and
  // cuDNN's "include padding"); windows clipped by the kFull rounding divide by
  // the part that lies inside the padded input.
};

struct FcParam {
  int num_hidden = 0;
  bool no_bias = false;
  // The input is flattened to (N, prod(other dims)) like MXNet's FullyConnected.
};

struct BatchNormParam {
  float eps = 1e-5f;       // models set theirs explicitly (2015: 1e-10, resnet 2e-5)
  float momentum = 0.9f;   // moving = momentum * moving + (1 - momentum) * batch
  bool fix_gamma = false;  // gamma held at 1 (its gradient is zero), as MXNet does
  // Training normalizes with the batch mean and biased batch variance and folds
  // those into the moving stats (as MXNet does); Forward(is_train=false)
  // normalizes with the moving stats.
};

enum class ActType { kRelu, kTanh, kSigmoid };

struct DropoutParam {
  float p = 0.5f;  // probability of dropping; kept values are scaled by 1/(1-p) in training
};

// What a node's parameter is for (the initializer picks its rule from this).
enum class ParamRole { kWeight, kBias, kGamma, kBeta, kMovingMean, kMovingVar };

struct ParamInfo {
  std::string name;  // "conv1_weight"
  Shape shape;
  ParamRole role;
  NodeId node;
};

struct Node {
  NodeId id = kInvalidNode;
  OpType op = OpType::kInput;
  std::string name;
  std::vector<NodeId> inputs;
  Shape out_shape;  // per sample (no batch dimension)
  // Indices into Graph::params() / Graph::aux_states(), in the operator's order:
  // conv/fc: weight[, bias]; batchnorm: gamma, beta / aux: moving_mean, moving_var.
  std::vector<int> params;
  std::vector<int> aux;
  ConvParam conv;
  PoolParam pool;
  FcParam fc;
  BatchNormParam bn;
  ActType act = ActType::kRelu;
  DropoutParam dropout;
  float softmax_grad_scale = 1.0f;
};

// One row of `pstrain summary`.
struct LayerSummary {
  std::string name;
  std::string op;
  Shape out_shape;         // per sample
  int64_t num_params = 0;  // trainable parameters (aux states not counted)
};

class Graph {
 public:
  Graph() = default;

  // ---- builders: each returns the new node, or kInvalidNode after an error ----

  // A network input of the given per-sample shape, e.g. "data" (1,28,28).
  NodeId Input(const std::string& name, const Shape& shape);
  NodeId Convolution(const std::string& name, NodeId in, const ConvParam& p);
  NodeId Pooling(const std::string& name, NodeId in, const PoolParam& p);
  NodeId FullyConnected(const std::string& name, NodeId in, const FcParam& p);
  NodeId BatchNorm(const std::string& name, NodeId in, const BatchNormParam& p);
  NodeId Activation(const std::string& name, NodeId in, ActType type);
  // Concatenates along channels (dim 1 of NCHW). Other dims must agree.
  NodeId Concat(const std::string& name, const std::vector<NodeId>& ins);
  // Element-wise sum of same-shaped inputs.
  NodeId Add(const std::string& name, const std::vector<NodeId>& ins);
  NodeId Dropout(const std::string& name, NodeId in, const DropoutParam& p);
  NodeId Flatten(const std::string& name, NodeId in);
  // Softmax over the flattened per-sample input plus cross-entropy against an
  // integer label given as float. Creates the input "<name>_label" with shape ()
  // (MXNet's "softmax_label"). Its output is the probabilities. Its backward
  // needs no output gradient: it starts backprop with (p - onehot(label)) scaled
  // by `grad_scale` (MXNet's default 1, not 1/batch: the optimizer rescales).
  NodeId SoftmaxOutput(const std::string& name, NodeId in, float grad_scale = 1.0f);

  // ---- results ----

  // The first error any builder call hit; ok if none.
  const Status& status() const { return status_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const Node& node(NodeId id) const { return nodes_[id]; }
  // Trainable parameters, in creation order (= KV key order).
  const std::vector<ParamInfo>& params() const { return params_; }
  // Auxiliary states (BatchNorm moving stats), in creation order; not trained,
  // not pushed.
  const std::vector<ParamInfo>& aux_states() const { return aux_; }
  // Input nodes in creation order (data first, then labels).
  const std::vector<NodeId>& input_nodes() const { return inputs_; }
  // The node named `name`, or kInvalidNode.
  NodeId Find(const std::string& name) const;
  // The last node added (the network's output).
  NodeId output() const { return nodes_.empty() ? kInvalidNode : nodes_.back().id; }

  int64_t NumParams() const;  // total trainable elements
  int64_t NumAuxElements() const;
  // Floating-point operations of node `id`'s forward pass for one sample, an
  // estimate: a convolution or fully connected layer counts 2 per
  // multiply-add (bias excluded), pooling one per window element read,
  // batch norm 5 per element (mean, variance, normalize, scale, shift), ReLU 1
  // and tanh/sigmoid 4 per element, a sum one per element and extra input,
  // dropout 2 per element, the softmax loss 4 per class; inputs, concat and
  // flatten (copies) 0. Its backward is about twice this (the input's and the
  // parameters' gradients).
  double ForwardFlops(NodeId id) const;
  // Per node: whether the executor runs its backward, i.e. it lies on a path
  // from a parameter to the SoftmaxOutput (the first convolution computes no
  // input gradient, but its weights'). All false without a SoftmaxOutput.
  std::vector<bool> NodesWithBackward() const;
  // One row per non-input node, in creation order.
  std::vector<LayerSummary> Summary() const;

 private:
  // Convolution and pooling: the input is (C,H,W), and the kernel fits the
  // padded input (hp x wp). Fail with a message naming `kind` and `name` if not.
  bool CheckImageInput(NodeId in, const char* kind, const std::string& name);
  bool CheckKernelFits(const char* kind, const std::string& name, const Shape& x, int kh, int kw,
                       int64_t hp, int64_t wp);
  // A node of `op` named `name` reading `inputs`; the caller sets the rest.
  static Node NewNode(OpType op, const std::string& name, std::vector<NodeId> inputs);
  NodeId AddNode(Node node);
  bool CheckInput(NodeId in, const std::string& who);
  int AddParam(Node* node, const std::string& suffix, Shape shape, ParamRole role);
  int AddAux(Node* node, const std::string& suffix, Shape shape, ParamRole role);
  void Fail(const std::string& msg);

  Status status_;
  std::vector<Node> nodes_;
  std::vector<ParamInfo> params_;
  std::vector<ParamInfo> aux_;
  std::vector<NodeId> inputs_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_GRAPH_H_
