// Model builders: MXNet's image-classification networks as pstrain Graphs.
//
// Every model has the inputs "data" (image_shape) and "softmax_label", and ends
// in SoftmaxOutput "softmax"; parameter names and order follow the MXNet
// symbol files (mxnet_facts.md 5), so trainable counts equal MXNet's.
//
// Known names (num_layers applies to resnet only):
//   mlp                    784-128-64-10 (any image shape; flattened)
//   lenet                  MXNet LeNet (tanh, max pools)
//   inception-bn-28-small  CIFAR Inception-BN, 2015 ceil pooling
//   inception-bn           ILSVRC Inception-BN, 2015 ceil pooling
//   resnet                 pre-activation ResNet; CIFAR (H <= 32) or ImageNet
//   inception-v3           MXNet's symbol_inception-v3 (299x299)
//   keras-mnist-cnn        the Keras mnist_cnn of seed 002
//   neon-cifar10-conv      neon's examples/cifar10_conv.py of seed 004
#ifndef PSTRAIN_MODELS_MODELS_H_
#define PSTRAIN_MODELS_MODELS_H_

#include <string>
#include <vector>

#include "common/status.h"
#include "nn/graph.h"
#include "nn/tensor.h"

namespace pstrain {

struct ModelOptions {
  std::string name;
  // resnet: 18/34/50/101/152 (ImageNet) or 6n+2 / 9n+2 (CIFAR); 0: 50 or
  // 110, MXNet's scripts' defaults.
  int num_layers = 0;
  Shape image_shape;  // (C,H,W); empty = the model's default
  // 0 = the model's default: 10, or 1000 for ImageNet models (10 for those too
  // when the image is at most 32 pixels high, e.g. resnet's CIFAR variant).
  int num_classes = 0;
};

// Builds the named model. InvalidArgument for an unknown name (the message lists
// the known ones), an unsupported num_layers, or an image shape the network
// cannot take (the failing layer is named).
StatusOr<Graph> BuildModel(const ModelOptions& options);

// The known model names, in the order above.
std::vector<std::string> KnownModels();

// The model's default image shape and class count (for summary/train defaults).
Shape DefaultImageShape(const std::string& name);
int DefaultNumClasses(const std::string& name);

}  // namespace pstrain

#endif  // PSTRAIN_MODELS_MODELS_H_
