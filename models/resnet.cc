// Pre-activation ResNet (MXNet's symbols/resnet.py, after tornadomeet).
#include <string>
#include <vector>

#include "models/builders.h"

namespace pstrain::models {

namespace {

constexpr BatchNormParam kResnetBn{2e-5f, 0.9f, false};

NodeId BnRelu(Graph* g, NodeId x, const std::string& name, const std::string& suffix) {
  x = g->BatchNorm(name + "_bn" + suffix, x, kResnetBn);
  return g->Activation(name + "_relu" + suffix, x, ActType::kRelu);
}

// One unit: BN-ReLU-conv twice (basic) or three times (bottleneck, width/4
// inside); the shortcut is the input, or a 1x1 conv of the first activation
// when the shape changes. Creation order follows MXNet's argument order.
NodeId ResidualUnit(Graph* g, NodeId x, int filters, int stride, bool dim_match,
                    const std::string& name, bool bottleneck) {
  NodeId act1 = BnRelu(g, x, name, "1");
  NodeId y;
  if (bottleneck) {
    const int inner = filters / 4;
    y = g->Convolution(name + "_conv1", act1, Conv(inner, 1, 1, 1, 1, 0, 0, true));
    y = g->Convolution(name + "_conv2", BnRelu(g, y, name, "2"),
                       Conv(inner, 3, 3, stride, stride, 1, 1, true));
    y = g->Convolution(name + "_conv3", BnRelu(g, y, name, "3"),
                       Conv(filters, 1, 1, 1, 1, 0, 0, true));
  } else {
    y = g->Convolution(name + "_conv1", act1, Conv(filters, 3, 3, stride, stride, 1, 1, true));
    y = g->Convolution(name + "_conv2", BnRelu(g, y, name, "2"),
                       Conv(filters, 3, 3, 1, 1, 1, 1, true));
  }
  NodeId shortcut = x;
  if (!dim_match) {
    shortcut = g->Convolution(name + "_sc", act1, Conv(filters, 1, 1, stride, stride, 0, 0, true));
  }
  return g->Add(name + "_plus", {y, shortcut});
}

}  // namespace

// CIFAR when H <= 32 (MXNet's get_symbol switches at 28 and resnet() at 32; we
// use 32 for both so 32x32 CIFAR images work): 3 stages, basic units for
// (L-2) % 6 == 0 and L < 164, bottleneck for (L-2) % 9 == 0 and L >= 164.
// ImageNet otherwise: L in {18, 34, 50, 101, 152, 200, 269}.
Status BuildResnet(const ModelOptions& o, Graph* g) {
  const int64_t height = o.image_shape[1];
  // 0: MXNet's scripts' defaults (train_cifar10.py 110, train_imagenet.py 50).
  const int L = o.num_layers != 0 ? o.num_layers : (height <= 32 ? 110 : 50);
  std::vector<int> units, filters;
  bool bottleneck;
  const bool cifar = height <= 32;
  if (cifar) {
    int per_stage;
    if (L >= 164 && (L - 2) % 9 == 0) {
      per_stage = (L - 2) / 9;
      filters = {16, 64, 128, 256};
      bottleneck = true;
    } else if (L > 2 && L < 164 && (L - 2) % 6 == 0) {
      per_stage = (L - 2) / 6;
      filters = {16, 16, 32, 64};
      bottleneck = false;
    } else {
      return Status::InvalidArgument(StrCat(
          "resnet for images of height <= 32 needs num_layers = 6n+2 (< 164) or 9n+2 (>= 164), "
          "got ",
          L));
    }
    units.assign(3, per_stage);
  } else {
    switch (L) {
      case 18:
        units = {2, 2, 2, 2};
        break;
      case 34:
        units = {3, 4, 6, 3};
        break;
      case 50:
        units = {3, 4, 6, 3};
        break;
      case 101:
        units = {3, 4, 23, 3};
        break;
      case 152:
        units = {3, 8, 36, 3};
        break;
      case 200:
        units = {3, 24, 36, 3};
        break;
      case 269:
        units = {3, 30, 48, 8};
        break;
      default:
        return Status::InvalidArgument(StrCat(
            "resnet for ImageNet-sized images needs num_layers in 18, 34, 50, 101, 152, 200, "
            "269; got ",
            L));
    }
    bottleneck = L >= 50;
    filters = bottleneck ? std::vector<int>{64, 256, 512, 1024, 2048}
                         : std::vector<int>{64, 64, 128, 256, 512};
  }
  NodeId x = g->Input("data", o.image_shape);
  x = g->BatchNorm("bn_data", x, BatchNormParam{2e-5f, 0.9f, true});
  if (cifar) {
    x = g->Convolution("conv0", x, Conv(filters[0], 3, 3, 1, 1, 1, 1, true));
  } else {
    x = g->Convolution("conv0", x, Conv(filters[0], 7, 7, 2, 2, 3, 3, true));
    x = g->Activation("relu0", g->BatchNorm("bn0", x, kResnetBn), ActType::kRelu);
    x = g->Pooling("pool0", x, Pool(PoolType::kMax, 3, 2, 1));
  }
  for (size_t i = 0; i < units.size(); ++i) {
    const int stride = i == 0 ? 1 : 2;
    const std::string stage = "stage" + std::to_string(i + 1);
    x = ResidualUnit(g, x, filters[i + 1], stride, false, stage + "_unit1", bottleneck);
    for (int j = 1; j < units[i]; ++j) {
      x = ResidualUnit(g, x, filters[i + 1], 1, true, stage + "_unit" + std::to_string(j + 1),
                       bottleneck);
    }
  }
  x = g->Activation("relu1", g->BatchNorm("bn1", x, kResnetBn), ActType::kRelu);
  PoolParam gp;
  gp.type = PoolType::kAvg;
  gp.global = true;
  x = g->Pooling("pool1", x, gp);
  x = g->Flatten("flatten0", x);
  x = g->FullyConnected("fc1", x, {o.num_classes, false});
  g->SoftmaxOutput("softmax", x);
  return Status::Ok();
}

}  // namespace pstrain::models
