// mlp, lenet and the two seed networks (Keras MNIST CNN, neon CIFAR-10 conv).
#include "models/builders.h"

namespace pstrain::models {

ConvParam Conv(int filters, int kh, int kw, int sh, int sw, int ph, int pw, bool no_bias) {
  ConvParam p;
  p.num_filter = filters;
  p.kernel_h = kh;
  p.kernel_w = kw;
  p.stride_h = sh;
  p.stride_w = sw;
  p.pad_h = ph;
  p.pad_w = pw;
  p.no_bias = no_bias;
  return p;
}

PoolParam Pool(PoolType type, int k, int s, int pad, PoolConvention conv) {
  PoolParam p;
  p.type = type;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = s;
  p.pad_h = p.pad_w = pad;
  p.convention = conv;
  return p;
}

// MXNet's mlp: flatten -> fc1 128 -> relu -> fc2 64 -> relu -> fc3 -> softmax.
Status BuildMlp(const ModelOptions& o, Graph* g) {
  NodeId x = g->Input("data", o.image_shape);
  x = g->Flatten("flatten", x);
  x = g->Activation("relu1", g->FullyConnected("fc1", x, {128, false}), ActType::kRelu);
  x = g->Activation("relu2", g->FullyConnected("fc2", x, {64, false}), ActType::kRelu);
  x = g->FullyConnected("fc3", x, {o.num_classes, false});
  g->SoftmaxOutput("softmax", x);
  return Status::Ok();
}

// MXNet's LeNet: two conv(5x5)/tanh/maxpool(2x2, s2) stages, fc 500 tanh, fc.
Status BuildLenet(const ModelOptions& o, Graph* g) {
  NodeId x = g->Input("data", o.image_shape);
  x = g->Activation("tanh1", g->Convolution("conv1", x, Conv(20, 5, 5)), ActType::kTanh);
  x = g->Pooling("pool1", x, Pool(PoolType::kMax, 2, 2));
  x = g->Activation("tanh2", g->Convolution("conv2", x, Conv(50, 5, 5)), ActType::kTanh);
  x = g->Pooling("pool2", x, Pool(PoolType::kMax, 2, 2));
  x = g->Flatten("flatten", x);
  x = g->Activation("tanh3", g->FullyConnected("fc1", x, {500, false}), ActType::kTanh);
  x = g->FullyConnected("fc2", x, {o.num_classes, false});
  g->SoftmaxOutput("softmax", x);
  return Status::Ok();
}

// Seed 002 ran keras/examples/mnist_cnn.py under Keras 1.2.2 (the seed's own
// path): conv 3x3 32 relu -> conv 3x3 32 relu -> maxpool 2x2 -> dropout 0.25 ->
// dense 128 relu -> dropout 0.5 -> dense 10 softmax; 600,810 parameters.
// (Keras 2's version widens the second conv to 64: 1,199,882.)
Status BuildKerasMnistCnn(const ModelOptions& o, Graph* g) {
  NodeId x = g->Input("data", o.image_shape);
  x = g->Activation("relu1", g->Convolution("conv1", x, Conv(32, 3, 3)), ActType::kRelu);
  x = g->Activation("relu2", g->Convolution("conv2", x, Conv(32, 3, 3)), ActType::kRelu);
  x = g->Pooling("pool1", x, Pool(PoolType::kMax, 2, 2));
  x = g->Dropout("dropout1", x, {0.25f});
  x = g->Flatten("flatten", x);
  x = g->Activation("relu3", g->FullyConnected("fc1", x, {128, false}), ActType::kRelu);
  x = g->Dropout("dropout2", x, {0.5f});
  x = g->FullyConnected("fc2", x, {o.num_classes, false});
  g->SoftmaxOutput("softmax", x);
  return Status::Ok();
}

// Seed 004 timed neon's examples/cifar10_conv.py against an "equivalent" MXNet
// symbol: [conv 5x5 16 -> BN -> relu -> maxpool 2x2/2] -> [conv 5x5 32 -> BN ->
// relu -> maxpool 2x2/2] -> fc 500 -> BN -> relu -> fc 10 -> softmax. We build
// that MXNet symbol (convs and fcs with bias, MXNet's BN defaults eps 1e-3,
// momentum 0.9), with the relu after fc1's BN that neon has and the MXNet
// file meant to have (its fc1_act is left unconnected by a typo); the relu has
// no parameters, so the count is the MXNet file's: 420,654.
Status BuildNeonCifar10Conv(const ModelOptions& o, Graph* g) {
  const BatchNormParam bn{1e-3f, 0.9f, false};
  NodeId x = g->Input("data", o.image_shape);
  x = g->Convolution("conv1", x, Conv(16, 5, 5));
  x = g->Activation("relu1", g->BatchNorm("bn1", x, bn), ActType::kRelu);
  x = g->Pooling("pool1", x, Pool(PoolType::kMax, 2, 2));
  x = g->Convolution("conv2", x, Conv(32, 5, 5));
  x = g->Activation("relu2", g->BatchNorm("bn2", x, bn), ActType::kRelu);
  x = g->Pooling("pool2", x, Pool(PoolType::kMax, 2, 2));
  x = g->Flatten("flatten", x);
  x = g->FullyConnected("fc1", x, {500, false});
  x = g->Activation("relu3", g->BatchNorm("fc1_bn", x, bn), ActType::kRelu);
  x = g->FullyConnected("fc2", x, {o.num_classes, false});
  g->SoftmaxOutput("softmax", x);
  return Status::Ok();
}

}  // namespace pstrain::models
