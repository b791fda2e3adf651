// Inception-BN (the 2015 CIFAR "28-small" and ILSVRC symbols) and Inception-v3.
#include <string>

#include "models/builders.h"

namespace pstrain::models {

namespace {

// 2015 BN: eps 1e-10 in the symbol files, 1e-10 + 1e-5 in 1.x; we use 1.x's
// (1e-10 alone divides by ~0 for a constant channel). gamma learned.
constexpr BatchNormParam kInceptionBn{1e-5f + 1e-10f, 0.9f, false};

// conv (with bias) -> BN -> relu, named conv_<n>, bn_<n>, relu_<n>.
NodeId ConvFactory(Graph* g, NodeId x, const std::string& name, const ConvParam& p) {
  x = g->Convolution("conv_" + name, x, p);
  x = g->BatchNorm("bn_" + name, x, kInceptionBn);
  return g->Activation("relu_" + name, x, ActType::kRelu);
}

constexpr PoolConvention kFull = PoolConvention::kFull;

// ---- Inception-BN-28-small (CIFAR-10) ----

NodeId SimpleFactory(Graph* g, NodeId x, int c1, int c3, const std::string& name) {
  NodeId a = ConvFactory(g, x, name + "_1x1", Conv(c1, 1, 1));
  NodeId b = ConvFactory(g, x, name + "_3x3", Conv(c3, 3, 3, 1, 1, 1, 1));
  return g->Concat("ch_concat_" + name + "_chconcat", {a, b});
}

NodeId DownsampleFactory(Graph* g, NodeId x, int c3, const std::string& name) {
  NodeId a = ConvFactory(g, x, name + "_conv", Conv(c3, 3, 3, 2, 2, 1, 1));
  NodeId b = g->Pooling("max_pool_" + name + "_pool", x, Pool(PoolType::kMax, 3, 2, 0, kFull));
  return g->Concat("ch_concat_" + name + "_chconcat", {a, b});
}

// ---- Inception-BN (ILSVRC12) ----

NodeId InceptionA(Graph* g, NodeId x, int n1, int n3r, int n3, int nd3r, int nd3, PoolType pool,
                  int proj, const std::string& name) {
  NodeId c1 = ConvFactory(g, x, name + "_1x1", Conv(n1, 1, 1));
  NodeId c3 = ConvFactory(g, x, name + "_3x3_reduce", Conv(n3r, 1, 1));
  c3 = ConvFactory(g, c3, name + "_3x3", Conv(n3, 3, 3, 1, 1, 1, 1));
  NodeId cd = ConvFactory(g, x, name + "_double_3x3_reduce", Conv(nd3r, 1, 1));
  cd = ConvFactory(g, cd, name + "_double_3x3_0", Conv(nd3, 3, 3, 1, 1, 1, 1));
  cd = ConvFactory(g, cd, name + "_double_3x3_1", Conv(nd3, 3, 3, 1, 1, 1, 1));
  const std::string pname = (pool == PoolType::kMax ? "max_pool_" : "avg_pool_") + name + "_pool";
  NodeId p = g->Pooling(pname, x, Pool(pool, 3, 1, 1, kFull));
  p = ConvFactory(g, p, name + "_proj", Conv(proj, 1, 1));
  return g->Concat("ch_concat_" + name + "_chconcat", {c1, c3, cd, p});
}

NodeId InceptionB(Graph* g, NodeId x, int n3r, int n3, int nd3r, int nd3, const std::string& name) {
  NodeId c3 = ConvFactory(g, x, name + "_3x3_reduce", Conv(n3r, 1, 1));
  c3 = ConvFactory(g, c3, name + "_3x3", Conv(n3, 3, 3, 2, 2, 1, 1));
  NodeId cd = ConvFactory(g, x, name + "_double_3x3_reduce", Conv(nd3r, 1, 1));
  cd = ConvFactory(g, cd, name + "_double_3x3_0", Conv(nd3, 3, 3, 1, 1, 1, 1));
  cd = ConvFactory(g, cd, name + "_double_3x3_1", Conv(nd3, 3, 3, 2, 2, 1, 1));
  NodeId p = g->Pooling("max_pool_" + name + "_pool", x, Pool(PoolType::kMax, 3, 2, 0, kFull));
  return g->Concat("ch_concat_" + name + "_chconcat", {c3, cd, p});
}

NodeId Classifier(Graph* g, NodeId x, int num_classes) {
  PoolParam gp;
  gp.type = PoolType::kAvg;
  gp.global = true;
  x = g->Pooling("global_pool", x, gp);
  x = g->Flatten("flatten", x);
  x = g->FullyConnected("fc1", x, {num_classes, false});
  return g->SoftmaxOutput("softmax", x);
}

// ---- Inception-v3 (MXNet's symbol_inception-v3.py) ----

// conv (no bias) -> BN (fix_gamma, MXNet 1.x defaults eps 1e-3, momentum 0.9) -> relu.
NodeId V3Conv(Graph* g, NodeId x, const std::string& name, const ConvParam& p) {
  ConvParam q = p;
  q.no_bias = true;
  x = g->Convolution(name + "_conv2d", x, q);
  x = g->BatchNorm(name + "_batchnorm", x, BatchNormParam{1e-3f, 0.9f, true});
  return g->Activation(name + "_relu", x, ActType::kRelu);
}

std::string PoolName(PoolType t, const std::string& name) {
  return (t == PoolType::kMax ? "max_pool_" : "avg_pool_") + name + "_pool";
}

NodeId V3A(Graph* g, NodeId x, int n1, int n3r, int n31, int n32, int n5r, int n5, PoolType pool,
           int proj, const std::string& name) {
  NodeId t1 = V3Conv(g, x, name + "_conv", Conv(n1, 1, 1));
  NodeId t5 = V3Conv(g, x, name + "_tower_conv", Conv(n5r, 1, 1));
  t5 = V3Conv(g, t5, name + "_tower_conv_1", Conv(n5, 5, 5, 1, 1, 2, 2));
  NodeId t3 = V3Conv(g, x, name + "_tower_1_conv", Conv(n3r, 1, 1));
  t3 = V3Conv(g, t3, name + "_tower_1_conv_1", Conv(n31, 3, 3, 1, 1, 1, 1));
  t3 = V3Conv(g, t3, name + "_tower_1_conv_2", Conv(n32, 3, 3, 1, 1, 1, 1));
  NodeId p = g->Pooling(PoolName(pool, name), x, Pool(pool, 3, 1, 1));
  p = V3Conv(g, p, name + "_tower_2_conv", Conv(proj, 1, 1));
  return g->Concat("ch_concat_" + name + "_chconcat", {t1, t5, t3, p});
}

NodeId V3B(Graph* g, NodeId x, int n3, int nd3r, int nd31, int nd32, const std::string& name) {
  NodeId t3 = V3Conv(g, x, name + "_conv", Conv(n3, 3, 3, 2, 2));
  NodeId td = V3Conv(g, x, name + "_tower_conv", Conv(nd3r, 1, 1));
  td = V3Conv(g, td, name + "_tower_conv_1", Conv(nd31, 3, 3, 1, 1, 1, 1));
  td = V3Conv(g, td, name + "_tower_conv_2", Conv(nd32, 3, 3, 2, 2));
  NodeId p = g->Pooling(PoolName(PoolType::kMax, name), x, Pool(PoolType::kMax, 3, 2));
  return g->Concat("ch_concat_" + name + "_chconcat", {t3, td, p});
}

NodeId V3C(Graph* g, NodeId x, int n1, int d7r, int d71, int d72, int q7r, int q71, int q72,
           int q73, int q74, PoolType pool, int proj, const std::string& name) {
  NodeId t1 = V3Conv(g, x, name + "_conv", Conv(n1, 1, 1));
  NodeId td = V3Conv(g, x, name + "_tower_conv", Conv(d7r, 1, 1));
  td = V3Conv(g, td, name + "_tower_conv_1", Conv(d71, 1, 7, 1, 1, 0, 3));
  td = V3Conv(g, td, name + "_tower_conv_2", Conv(d72, 7, 1, 1, 1, 3, 0));
  NodeId tq = V3Conv(g, x, name + "_tower_1_conv", Conv(q7r, 1, 1));
  tq = V3Conv(g, tq, name + "_tower_1_conv_1", Conv(q71, 7, 1, 1, 1, 3, 0));
  tq = V3Conv(g, tq, name + "_tower_1_conv_2", Conv(q72, 1, 7, 1, 1, 0, 3));
  tq = V3Conv(g, tq, name + "_tower_1_conv_3", Conv(q73, 7, 1, 1, 1, 3, 0));
  tq = V3Conv(g, tq, name + "_tower_1_conv_4", Conv(q74, 1, 7, 1, 1, 0, 3));
  NodeId p = g->Pooling(PoolName(pool, name), x, Pool(pool, 3, 1, 1));
  p = V3Conv(g, p, name + "_tower_2_conv", Conv(proj, 1, 1));
  return g->Concat("ch_concat_" + name + "_chconcat", {t1, td, tq, p});
}

NodeId V3D(Graph* g, NodeId x, int n3r, int n3, int d7r, int d71, int d72, int d73,
           const std::string& name) {
  NodeId t3 = V3Conv(g, x, name + "_tower_conv", Conv(n3r, 1, 1));
  t3 = V3Conv(g, t3, name + "_tower_conv_1", Conv(n3, 3, 3, 2, 2));
  NodeId td = V3Conv(g, x, name + "_tower_1_conv", Conv(d7r, 1, 1));
  td = V3Conv(g, td, name + "_tower_1_conv_1", Conv(d71, 1, 7, 1, 1, 0, 3));
  td = V3Conv(g, td, name + "_tower_1_conv_2", Conv(d72, 7, 1, 1, 1, 3, 0));
  td = V3Conv(g, td, name + "_tower_1_conv_3", Conv(d73, 3, 3, 2, 2));
  NodeId p = g->Pooling(PoolName(PoolType::kMax, name), x, Pool(PoolType::kMax, 3, 2));
  return g->Concat("ch_concat_" + name + "_chconcat", {t3, td, p});
}

NodeId V3E(Graph* g, NodeId x, int n1, int d3r, int d31, int d32, int t3r, int t3, int t31, int t32,
           PoolType pool, int proj, const std::string& name) {
  NodeId a = V3Conv(g, x, name + "_conv", Conv(n1, 1, 1));
  NodeId d = V3Conv(g, x, name + "_tower_conv", Conv(d3r, 1, 1));
  NodeId da = V3Conv(g, d, name + "_tower_mixed_conv", Conv(d31, 1, 3, 1, 1, 0, 1));
  NodeId db = V3Conv(g, d, name + "_tower_mixed_conv_1", Conv(d32, 3, 1, 1, 1, 1, 0));
  NodeId t = V3Conv(g, x, name + "_tower_1_conv", Conv(t3r, 1, 1));
  t = V3Conv(g, t, name + "_tower_1_conv_1", Conv(t3, 3, 3, 1, 1, 1, 1));
  NodeId ta = V3Conv(g, t, name + "_tower_1_mixed_conv", Conv(t31, 1, 3, 1, 1, 0, 1));
  NodeId tb = V3Conv(g, t, name + "_tower_1_mixed_conv_1", Conv(t32, 3, 1, 1, 1, 1, 0));
  NodeId p = g->Pooling(PoolName(pool, name), x, Pool(pool, 3, 1, 1));
  p = V3Conv(g, p, name + "_tower_2_conv", Conv(proj, 1, 1));
  return g->Concat("ch_concat_" + name + "_chconcat", {a, da, db, ta, tb, p});
}

}  // namespace

Status BuildInceptionBn28Small(const ModelOptions& o, Graph* g) {
  NodeId x = g->Input("data", o.image_shape);
  x = ConvFactory(g, x, "conv1", Conv(96, 3, 3, 1, 1, 1, 1));
  x = SimpleFactory(g, x, 32, 32, "in3a");
  x = SimpleFactory(g, x, 32, 48, "in3b");
  x = DownsampleFactory(g, x, 80, "in3c");
  x = SimpleFactory(g, x, 112, 48, "in4a");
  x = SimpleFactory(g, x, 96, 64, "in4b");
  x = SimpleFactory(g, x, 80, 80, "in4c");
  x = SimpleFactory(g, x, 48, 96, "in4d");
  x = DownsampleFactory(g, x, 96, "in4e");
  x = SimpleFactory(g, x, 176, 160, "in5a");
  x = SimpleFactory(g, x, 176, 160, "in5b");
  Classifier(g, x, o.num_classes);
  return Status::Ok();
}

Status BuildInceptionBn(const ModelOptions& o, Graph* g) {
  const PoolType kAvg = PoolType::kAvg, kMax = PoolType::kMax;
  NodeId x = g->Input("data", o.image_shape);
  x = ConvFactory(g, x, "conv1", Conv(64, 7, 7, 2, 2, 3, 3));
  x = g->Pooling("pool1", x, Pool(kMax, 3, 2, 0, kFull));
  x = ConvFactory(g, x, "conv2red", Conv(64, 1, 1));
  x = ConvFactory(g, x, "conv2", Conv(192, 3, 3, 1, 1, 1, 1));
  x = g->Pooling("pool2", x, Pool(kMax, 3, 2, 0, kFull));
  x = InceptionA(g, x, 64, 64, 64, 64, 96, kAvg, 32, "3a");
  x = InceptionA(g, x, 64, 64, 96, 64, 96, kAvg, 64, "3b");
  x = InceptionB(g, x, 128, 160, 64, 96, "3c");
  x = InceptionA(g, x, 224, 64, 96, 96, 128, kAvg, 128, "4a");
  x = InceptionA(g, x, 192, 96, 128, 96, 128, kAvg, 128, "4b");
  x = InceptionA(g, x, 160, 128, 160, 128, 160, kAvg, 128, "4c");
  x = InceptionA(g, x, 96, 128, 192, 160, 192, kAvg, 128, "4d");
  x = InceptionB(g, x, 128, 192, 192, 256, "4e");
  x = InceptionA(g, x, 352, 192, 320, 160, 224, kAvg, 128, "5a");
  x = InceptionA(g, x, 352, 192, 320, 192, 224, kMax, 128, "5b");
  Classifier(g, x, o.num_classes);
  return Status::Ok();
}

Status BuildInceptionV3(const ModelOptions& o, Graph* g) {
  const PoolType kAvg = PoolType::kAvg, kMax = PoolType::kMax;
  NodeId x = g->Input("data", o.image_shape);
  x = V3Conv(g, x, "conv", Conv(32, 3, 3, 2, 2));
  x = V3Conv(g, x, "conv_1", Conv(32, 3, 3));
  x = V3Conv(g, x, "conv_2", Conv(64, 3, 3, 1, 1, 1, 1));
  x = g->Pooling("pool", x, Pool(kMax, 3, 2));
  x = V3Conv(g, x, "conv_3", Conv(80, 1, 1));
  x = V3Conv(g, x, "conv_4", Conv(192, 3, 3));
  x = g->Pooling("pool1", x, Pool(kMax, 3, 2));
  x = V3A(g, x, 64, 64, 96, 96, 48, 64, kAvg, 32, "mixed");
  x = V3A(g, x, 64, 64, 96, 96, 48, 64, kAvg, 64, "mixed_1");
  x = V3A(g, x, 64, 64, 96, 96, 48, 64, kAvg, 64, "mixed_2");
  x = V3B(g, x, 384, 64, 96, 96, "mixed_3");
  x = V3C(g, x, 192, 128, 128, 192, 128, 128, 128, 128, 192, kAvg, 192, "mixed_4");
  x = V3C(g, x, 192, 160, 160, 192, 160, 160, 160, 160, 192, kAvg, 192, "mixed_5");
  x = V3C(g, x, 192, 160, 160, 192, 160, 160, 160, 160, 192, kAvg, 192, "mixed_6");
  x = V3C(g, x, 192, 192, 192, 192, 192, 192, 192, 192, 192, kAvg, 192, "mixed_7");
  x = V3D(g, x, 192, 320, 192, 192, 192, 192, "mixed_8");
  x = V3E(g, x, 320, 384, 384, 384, 448, 384, 384, 384, kAvg, 192, "mixed_9");
  x = V3E(g, x, 320, 384, 384, 384, 448, 384, 384, 384, kMax, 192, "mixed_10");
  Classifier(g, x, o.num_classes);
  return Status::Ok();
}

}  // namespace pstrain::models
