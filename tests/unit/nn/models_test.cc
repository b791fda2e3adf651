// Parameter counts of every model against MXNet's (mxnet_facts.md 5) and the
// references named in models/, plus shapes, names and errors.
#include "models/models.h"

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace pstrain {
namespace {

Graph Build(const std::string& name, int num_layers = 0, Shape shape = Shape(), int classes = 0) {
  ModelOptions o;
  o.name = name;
  o.num_layers = num_layers;
  o.image_shape = shape;
  o.num_classes = classes;
  StatusOr<Graph> g = BuildModel(o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(g).value() : Graph();
}

// `pstrain summary --network resnet --num-layers 20 --image-shape 3,28,28`
// with no --num-classes must print MXNet's CIFAR count: small images default
// to 10 classes, ImageNet-sized ones to 1000.
TEST(ModelsTest, DefaultClassesFollowTheImageSize) {
  EXPECT_EQ(Build("resnet", 20, {3, 28, 28}).NumParams(), 272544);
  EXPECT_EQ(Build("resnet", 110, {3, 28, 28}).NumParams(), 1730784);
  EXPECT_EQ(Build("resnet", 50, {3, 224, 224}).NumParams(), 25549486);
  EXPECT_EQ(Build("inception-bn", 0, {3, 224, 224}).NumParams(), 11295240);
  // No depth: MXNet's scripts' resnet-110 (CIFAR) and resnet-50 (ImageNet).
  EXPECT_EQ(Build("resnet", 0, {3, 28, 28}).NumParams(), 1730784);
  EXPECT_EQ(Build("resnet", 0, {3, 224, 224}).NumParams(), 25549486);
}

TEST(ModelsTest, MlpCount) {
  Graph g = Build("mlp");
  EXPECT_EQ(g.NumParams(), 109386);
  EXPECT_EQ(g.params().size(), 6u);
}

TEST(ModelsTest, LenetCountAndShapes) {
  Graph g = Build("lenet");
  EXPECT_EQ(g.NumParams(), 431080);
  ASSERT_EQ(g.params().size(), 8u);
  EXPECT_EQ(g.params()[0].name, "conv1_weight");
  EXPECT_EQ(g.params()[0].shape, (Shape{20, 1, 5, 5}));
  EXPECT_EQ(g.params()[1].name, "conv1_bias");
  EXPECT_EQ(g.params()[7].name, "fc2_bias");
  EXPECT_EQ(g.node(g.Find("pool2")).out_shape, (Shape{50, 4, 4}));
}

// The flops estimate behind --emulate-compute's shares, worked out by hand
// for LeNet (1x28x28), and which nodes run a backward.
TEST(ModelsTest, LenetForwardFlopsAndBackwardNodes) {
  Graph g = Build("lenet");
  auto flops = [&](const char* name) { return g.ForwardFlops(g.Find(name)); };
  EXPECT_DOUBLE_EQ(flops("conv1"), 2.0 * (20 * 24 * 24) * 1 * 25);  // 576,000
  EXPECT_DOUBLE_EQ(flops("tanh1"), 4.0 * 20 * 24 * 24);
  EXPECT_DOUBLE_EQ(flops("pool1"), 4.0 * 20 * 12 * 12);            // 2x2 windows
  EXPECT_DOUBLE_EQ(flops("conv2"), 2.0 * (50 * 8 * 8) * 20 * 25);  // 3,200,000
  EXPECT_DOUBLE_EQ(flops("flatten"), 0);
  EXPECT_DOUBLE_EQ(flops("fc1"), 2.0 * 500 * 800);
  EXPECT_DOUBLE_EQ(flops("fc2"), 2.0 * 10 * 500);
  EXPECT_DOUBLE_EQ(flops("softmax"), 4.0 * 10);
  double total = 0;
  for (const Node& n : g.nodes()) total += g.ForwardFlops(n.id);
  EXPECT_DOUBLE_EQ(total, 4661640);
  const std::vector<bool> bwd = g.NodesWithBackward();
  for (const Node& n : g.nodes()) {
    EXPECT_EQ(bwd[n.id], n.op != OpType::kInput) << n.name;  // conv1 on: its weights
  }
}

TEST(ModelsTest, InceptionBn28SmallCount) {
  Graph g = Build("inception-bn-28-small");
  EXPECT_EQ(g.NumParams(), 1652826);
  EXPECT_EQ(g.params().size(), 78u);
  EXPECT_EQ(g.NumAuxElements(), 3424);
  EXPECT_EQ(g.node(g.Find("ch_concat_in3c_chconcat")).out_shape, (Shape{160, 14, 14}));
  EXPECT_EQ(g.node(g.Find("ch_concat_in4e_chconcat")).out_shape, (Shape{240, 7, 7}));
}

TEST(ModelsTest, InceptionBnCount) {
  Graph g = Build("inception-bn");
  EXPECT_EQ(g.NumParams(), 11295240);
  EXPECT_EQ(g.params().size(), 278u);
  EXPECT_EQ(g.NumAuxElements(), 20032);
  EXPECT_EQ(g.node(g.Find("pool1")).out_shape, (Shape{64, 56, 56}));
  EXPECT_EQ(g.node(g.Find("ch_concat_4e_chconcat")).out_shape, (Shape{1056, 7, 7}));
}

TEST(ModelsTest, ResnetCifarCounts) {
  EXPECT_EQ(Build("resnet", 20, {3, 28, 28}, 10).NumParams(), 272544);
  EXPECT_EQ(Build("resnet", 56, {3, 28, 28}, 10).NumParams(), 855840);
  EXPECT_EQ(Build("resnet", 110, {3, 28, 28}, 10).NumParams(), 1730784);
  EXPECT_EQ(Build("resnet", 164, {3, 28, 28}, 10).NumParams(), 1703264);
  EXPECT_EQ(Build("resnet", 20, {3, 32, 32}, 10).NumParams(), 272544);
}

TEST(ModelsTest, ResnetImagenetCounts) {
  EXPECT_EQ(Build("resnet", 18, {3, 224, 224}, 1000).NumParams(), 11691950);
  EXPECT_EQ(Build("resnet", 50, {3, 224, 224}, 1000).NumParams(), 25549486);
  EXPECT_EQ(Build("resnet", 152, {3, 224, 224}, 1000).NumParams(), 60185262);
}

TEST(ModelsTest, InceptionV3Count) {
  // torchvision 0.14 inception_v3(aux_logits=False): 23,834,568 (conv without
  // bias, BN gamma+beta, fc with bias), the same layer list as MXNet's symbol.
  Graph g = Build("inception-v3");
  EXPECT_EQ(g.NumParams(), 23834568);
  EXPECT_EQ(g.node(g.Find("ch_concat_mixed_10_chconcat")).out_shape, (Shape{2048, 8, 8}));
}

TEST(ModelsTest, SeedModels) {
  EXPECT_EQ(Build("keras-mnist-cnn").NumParams(), 600810);
  EXPECT_EQ(Build("neon-cifar10-conv").NumParams(), 420654);
}

TEST(ModelsTest, SummaryTotalsMatch) {
  Graph g = Build("lenet");
  int64_t total = 0;
  for (const LayerSummary& row : g.Summary()) total += row.num_params;
  EXPECT_EQ(total, 431080);
  EXPECT_EQ(g.Summary().front().name, "conv1");
  EXPECT_EQ(g.Summary().front().op, "Convolution");
}

TEST(ModelsTest, UnknownNameListsKnownOnes) {
  ModelOptions o;
  o.name = "alexnet";
  StatusOr<Graph> g = BuildModel(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("lenet"), std::string::npos) << g.status();
  EXPECT_NE(g.status().message().find("inception-v3"), std::string::npos);
}

TEST(ModelsTest, BadResnetDepthAndTinyImageAreErrors) {
  ModelOptions o;
  o.name = "resnet";
  o.num_layers = 21;
  o.image_shape = Shape{3, 28, 28};
  EXPECT_FALSE(BuildModel(o).ok());
  o.name = "lenet";
  o.image_shape = Shape{1, 6, 6};
  StatusOr<Graph> g = BuildModel(o);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("conv2"), std::string::npos) << g.status();
}

// Image shapes whose element count passes int64 (16 x 1048577 x 1099510579201
// = 2^64 + 16 wrapped to 16 floats, and trained) are refused by name.
TEST(ModelsTest, AnImageShapeTooLargeToCountIsAnError) {
  for (Shape shape : {Shape{16, 1048577, 1099510579201}, Shape{1, 4294967297, 4294967297},
                      Shape{1, int64_t{1} << 21, int64_t{1} << 20}}) {
    ModelOptions o;
    o.name = "mlp";
    o.image_shape = shape;
    StatusOr<Graph> g = BuildModel(o);
    ASSERT_FALSE(g.ok()) << shape.ToString();
    EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(g.status().message().find("more than 2^40 elements per example"), std::string::npos)
        << g.status();
  }
}

}  // namespace
}  // namespace pstrain
