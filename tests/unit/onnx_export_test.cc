// ONNX export (onnx/onnx_export.h): every zoo model exports to a file that
// parses back into a consistent graph; the mappings of the layers that need
// care; the errors about parameters; `pstrain export` as a user runs it.
// (tests/unit/onnx_runtime_test.cc runs exported models in ONNX Runtime.)
#include "onnx/onnx_export.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "models/models.h"
#include "tests/test_util.h"
#include "tests/unit/onnx_test_graphs.h"
#include "worker/checkpoint.h"

namespace pstrain {
namespace {

Graph Build(const std::string& name, Shape shape = Shape(), int num_layers = 0) {
  ModelOptions o;
  o.name = name;
  o.image_shape = shape;
  o.num_layers = num_layers;
  StatusOr<Graph> g = BuildModel(o);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(g).value() : Graph();
}

using testing::RandomArrays;

const onnx::NodeProto* FindNode(const onnx::GraphProto& g, const std::string& name) {
  for (const onnx::NodeProto& n : g.node()) {
    if (n.name() == name) return &n;
  }
  return nullptr;
}

// Attribute `name` of `n` as ints (INT or INTS); empty if absent.
std::vector<int64_t> Ints(const onnx::NodeProto& n, const std::string& name) {
  for (const onnx::AttributeProto& a : n.attribute()) {
    if (a.name() != name) continue;
    if (a.type() == onnx::AttributeProto::INT) return {a.i()};
    return std::vector<int64_t>(a.ints().begin(), a.ints().end());
  }
  return {};
}

// The shape of a graph input or output: -1 for the symbolic dimension "N".
std::vector<int64_t> Dims(const onnx::ValueInfoProto& v) {
  std::vector<int64_t> dims;
  for (const auto& d : v.type().tensor_type().shape().dim()) {
    dims.push_back(d.has_dim_param() ? (d.dim_param() == "N" ? -1 : -2) : d.dim_value());
  }
  return dims;
}

// Checks what a reader of the file relies on: the opset; "data" with a
// symbolic batch; each node reads only values defined before it (an input,
// an initializer or an earlier node's output) with the arity its op takes;
// no value is defined twice; one initializer per parameter and aux state with
// its shape and bytes; the output named after the graph's last layer.
void ExpectConsistent(const Graph& graph, const std::vector<NamedArray>& arrays,
                      const onnx::ModelProto& m) {
  EXPECT_EQ(m.ir_version(), kOnnxIrVersion);
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).domain(), "");
  EXPECT_EQ(m.opset_import(0).version(), 13);
  const onnx::GraphProto& g = m.graph();

  std::set<std::string> defined;
  auto define = [&](const std::string& name) {
    EXPECT_FALSE(name.empty());
    EXPECT_TRUE(defined.insert(name).second) << name << " defined twice";
  };
  ASSERT_EQ(g.input_size(), 1);
  EXPECT_EQ(g.input(0).name(), "data");
  EXPECT_EQ(g.input(0).type().tensor_type().elem_type(), onnx::TensorProto::FLOAT);
  std::vector<int64_t> want = {-1};
  for (int64_t d : graph.node(graph.input_nodes()[0]).out_shape.dims()) want.push_back(d);
  EXPECT_EQ(Dims(g.input(0)), want);
  define("data");

  std::map<std::string, const NamedArray*> by_name;
  for (const NamedArray& a : arrays) by_name[a.name] = &a;
  std::set<std::string> fixed_gamma;
  for (const Node& n : graph.nodes()) {
    if (n.op == OpType::kBatchNorm && n.bn.fix_gamma) {
      fixed_gamma.insert(graph.params()[n.params[0]].name);
    }
  }
  size_t matched = 0;
  for (const onnx::TensorProto& t : g.initializer()) {
    define(t.name());
    auto it = by_name.find(t.name());
    if (it == by_name.end()) continue;  // a helper constant (Pad's amounts)
    ++matched;
    const NamedArray& a = *it->second;
    EXPECT_EQ(t.data_type(), onnx::TensorProto::FLOAT) << t.name();
    EXPECT_EQ(std::vector<int64_t>(t.dims().begin(), t.dims().end()), a.shape) << t.name();
    ASSERT_EQ(t.raw_data().size(), a.data.size() * sizeof(float)) << t.name();
    std::vector<float> values(a.data.size());
    std::memcpy(values.data(), t.raw_data().data(), t.raw_data().size());
    if (fixed_gamma.count(a.name) != 0) {
      EXPECT_EQ(values, std::vector<float>(a.data.size(), 1.0f)) << t.name();
    } else {
      EXPECT_EQ(values, a.data) << t.name();
    }
  }
  EXPECT_EQ(matched, arrays.size());

  // Inputs each op reads: {min, max}.
  const std::map<std::string, std::pair<int, int>> arity = {{"Conv", {2, 3}},
                                                            {"Gemm", {2, 3}},
                                                            {"BatchNormalization", {5, 5}},
                                                            {"Relu", {1, 1}},
                                                            {"Tanh", {1, 1}},
                                                            {"Sigmoid", {1, 1}},
                                                            {"MaxPool", {1, 1}},
                                                            {"AveragePool", {1, 1}},
                                                            {"GlobalMaxPool", {1, 1}},
                                                            {"GlobalAveragePool", {1, 1}},
                                                            {"Pad", {2, 3}},
                                                            {"Concat", {1, 1 << 20}},
                                                            {"Add", {2, 2}},
                                                            {"Sum", {1, 1 << 20}},
                                                            {"Identity", {1, 1}},
                                                            {"Flatten", {1, 1}},
                                                            {"Softmax", {1, 1}}};
  for (const onnx::NodeProto& n : g.node()) {
    auto a = arity.find(n.op_type());
    ASSERT_NE(a, arity.end()) << "unexpected op " << n.op_type() << " in " << n.name();
    EXPECT_GE(n.input_size(), a->second.first) << n.name();
    EXPECT_LE(n.input_size(), a->second.second) << n.name();
    for (const std::string& in : n.input()) {
      EXPECT_EQ(defined.count(in), 1u) << n.name() << " reads " << in << " before it is defined";
    }
    ASSERT_EQ(n.output_size(), 1) << n.name();
    define(n.output(0));
  }
  // Every layer's value is there under the layer's name.
  for (const Node& n : graph.nodes()) {
    if (n.op == OpType::kInput) continue;
    EXPECT_EQ(defined.count(n.name), 1u) << n.name;
    EXPECT_NE(FindNode(g, n.name), nullptr) << n.name;
  }
  ASSERT_EQ(g.output_size(), 1);
  const Node& last = graph.node(graph.output());
  EXPECT_EQ(g.output(0).name(), last.name);
  want = {-1};
  for (int64_t d : last.out_shape.dims()) want.push_back(d);
  EXPECT_EQ(Dims(g.output(0)), want);
}

class OnnxExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("onnx-export");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Exports, writes, reads back.
  onnx::ModelProto RoundTrip(const Graph& g, const std::vector<NamedArray>& arrays,
                             const std::string& name) {
    OnnxExportOptions o;
    o.graph_name = name;
    auto m = ExportOnnx(g, arrays, o);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
    if (!m.ok()) return {};
    const std::string path = dir_ + "/" + name + ".onnx";
    EXPECT_OK(WriteOnnxFile(*m, path));
    auto back = ReadOnnxFile(path);
    EXPECT_TRUE(back.ok()) << back.status();
    if (!back.ok()) return {};
    EXPECT_EQ(back->graph().node_size(), m->graph().node_size());
    std::filesystem::remove(path);
    return *back;
  }

  std::string dir_;
};

// Every model of the zoo (testing::ZooCases).
TEST_F(OnnxExportTest, EveryZooModelExportsToAConsistentGraph) {
  for (const testing::ZooCase& c : testing::ZooCases()) {
    SCOPED_TRACE(c.name + " " + c.shape.ToString());
    Graph g = Build(c.name, c.shape, c.num_layers);
    ASSERT_OK(g.status());
    std::vector<NamedArray> arrays = RandomArrays(g);
    onnx::ModelProto m = RoundTrip(g, arrays, c.name);
    ExpectConsistent(g, arrays, m);
  }
}

TEST_F(OnnxExportTest, LenetMapsLayerByLayer) {
  Graph g = Build("lenet");
  onnx::ModelProto m = RoundTrip(g, RandomArrays(g), "lenet");
  std::vector<std::string> ops;
  for (const onnx::NodeProto& n : m.graph().node()) ops.push_back(n.op_type());
  EXPECT_EQ(ops, (std::vector<std::string>{"Conv", "Tanh", "MaxPool", "Conv", "Tanh", "MaxPool",
                                           "Flatten", "Gemm", "Tanh", "Gemm", "Softmax"}));
  const onnx::NodeProto* conv1 = FindNode(m.graph(), "conv1");
  ASSERT_NE(conv1, nullptr);
  EXPECT_EQ(std::vector<std::string>(conv1->input().begin(), conv1->input().end()),
            (std::vector<std::string>{"data", "conv1_weight", "conv1_bias"}));
  EXPECT_EQ(Ints(*conv1, "kernel_shape"), (std::vector<int64_t>{5, 5}));
  EXPECT_EQ(Ints(*conv1, "pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(Ints(*conv1, "group"), (std::vector<int64_t>{1}));
  const onnx::NodeProto* pool1 = FindNode(m.graph(), "pool1");
  ASSERT_NE(pool1, nullptr);
  EXPECT_EQ(Ints(*pool1, "strides"), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Ints(*pool1, "pads"), (std::vector<int64_t>{0, 0, 0, 0}));
  const onnx::NodeProto* fc1 = FindNode(m.graph(), "fc1");
  ASSERT_NE(fc1, nullptr);
  EXPECT_EQ(Ints(*fc1, "transB"), (std::vector<int64_t>{1}));
  EXPECT_EQ(fc1->input(0), "flatten");
  const onnx::NodeProto* softmax = FindNode(m.graph(), "softmax");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(softmax->input(0), "fc2");
  EXPECT_EQ(Ints(*softmax, "axis"), (std::vector<int64_t>{1}));
  EXPECT_EQ(m.graph().output(0).name(), "softmax");
}

// MXNet's "full" rounding: inception-bn-28-small's 3x3/2 max pools on 28x28
// give 14x14 (floor would give 13): one row and column of end padding.
// BatchNorm carries eps and reads the moving statistics.
TEST_F(OnnxExportTest, FullPoolingRoundingBecomesEndPadding) {
  Graph g = Build("inception-bn-28-small");
  onnx::ModelProto m = RoundTrip(g, RandomArrays(g), "inception-bn-28-small");
  const onnx::NodeProto* pool = FindNode(m.graph(), "max_pool_in3c_pool");
  ASSERT_NE(pool, nullptr);
  EXPECT_EQ(pool->op_type(), "MaxPool");
  EXPECT_EQ(g.node(g.Find("max_pool_in3c_pool")).out_shape.ToString(), "(80,14,14)");
  EXPECT_EQ(Ints(*pool, "pads"), (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(Ints(*pool, "ceil_mode"), std::vector<int64_t>{});
  const onnx::NodeProto* bn = FindNode(m.graph(), "bn_conv1");
  ASSERT_NE(bn, nullptr);
  EXPECT_EQ(bn->op_type(), "BatchNormalization");
  EXPECT_EQ(std::vector<std::string>(bn->input().begin(), bn->input().end()),
            (std::vector<std::string>{"conv_conv1", "bn_conv1_gamma", "bn_conv1_beta",
                                      "bn_conv1_moving_mean", "bn_conv1_moving_var"}));
  ASSERT_EQ(bn->attribute_size(), 1);
  EXPECT_EQ(bn->attribute(0).name(), "epsilon");
  EXPECT_FLOAT_EQ(bn->attribute(0).f(), 1e-5f + 1e-10f);
  const onnx::NodeProto* gp = FindNode(m.graph(), "global_pool");
  ASSERT_NE(gp, nullptr);
  EXPECT_EQ(gp->op_type(), "GlobalAveragePool");
}

// The layer variants no zoo model has (tests/unit/onnx_test_graphs.h). A
// padded average pool whose full rounding spills past the padding becomes Pad
// (the padding counted) + AveragePool with end padding not counted; a max
// pool's spill is end padding. (onnx_runtime_test checks the numbers in ONNX
// Runtime.)
TEST_F(OnnxExportTest, OddLayersMapAsDocumented) {
  Graph g = testing::OddLayersGraph();
  ASSERT_OK(g.status());
  ASSERT_EQ(g.node(g.Find("avg_pad_full")).out_shape, (Shape{4, 4, 4}));
  ASSERT_EQ(g.node(g.Find("avg_full")).out_shape, (Shape{4, 3, 3}));
  ASSERT_EQ(g.node(g.Find("avg_in_pad")).out_shape, (Shape{4, 3, 3}));
  std::vector<NamedArray> arrays = RandomArrays(g);
  onnx::ModelProto m = RoundTrip(g, arrays, "odd");
  ExpectConsistent(g, arrays, m);
  const onnx::GraphProto& og = m.graph();
  auto node = [&](const char* name) {
    const onnx::NodeProto* n = FindNode(og, name);
    EXPECT_NE(n, nullptr) << name;
    return n != nullptr ? *n : onnx::NodeProto();
  };
  using V = std::vector<int64_t>;
  EXPECT_EQ(node("conv_g").input_size(), 2);
  EXPECT_EQ(Ints(node("conv_g"), "group"), V{2});
  EXPECT_EQ(node("drop").op_type(), "Identity");
  EXPECT_EQ(node("sig").op_type(), "Sigmoid");

  EXPECT_EQ(node("avg_pad_full_pad").op_type(), "Pad");
  EXPECT_EQ(node("avg_pad_full_pad").input_size(), 2);  // zeros
  EXPECT_EQ(node("avg_pad_full").input(0), "avg_pad_full_pad");
  EXPECT_EQ(Ints(node("avg_pad_full"), "pads"), (V{0, 0, 1, 1}));
  EXPECT_EQ(Ints(node("avg_pad_full"), "count_include_pad"), V{0});

  EXPECT_EQ(node("max_pad_full").input(0), "drop");
  EXPECT_EQ(Ints(node("max_pad_full"), "pads"), (V{1, 1, 2, 2}));

  EXPECT_EQ(node("avg_full").input(0), "drop");
  EXPECT_EQ(Ints(node("avg_full"), "pads"), (V{0, 0, 1, 1}));
  EXPECT_EQ(Ints(node("avg_full"), "count_include_pad"), V{0});

  EXPECT_EQ(node("avg_in_pad_pad").op_type(), "Pad");
  EXPECT_EQ(Ints(node("avg_in_pad"), "pads"), (V{0, 0, 1, 1}));

  EXPECT_EQ(Ints(node("avg_valid"), "pads"), (V{1, 1, 1, 1}));
  EXPECT_EQ(Ints(node("avg_valid"), "count_include_pad"), V{1});

  EXPECT_EQ(node("gmax").op_type(), "GlobalMaxPool");
  EXPECT_EQ(node("fc_a").input(0), "fc_a_flatten");
  EXPECT_EQ(node("fc_a").input_size(), 2);
  EXPECT_EQ(node("sum").op_type(), "Sum");
  EXPECT_EQ(node("sum").input_size(), 5);
  EXPECT_EQ(node("bn_flat").op_type(), "BatchNormalization");
  EXPECT_EQ(og.output(0).name(), "bn_flat");
}

// A max pool whose full rounding adds a window over padding alone (a maximum
// of nothing) has no mapping: the export is refused naming the layer and op.
TEST_F(OnnxExportTest, ALayerWithoutMappingIsRefusedNamingItAndItsOp) {
  Graph g;
  NodeId x = g.Input("data", Shape{1, 5, 5});
  // 5 + 2 = 7: floor 2 windows, full 3; the third starts in the right padding.
  g.Pooling("pool_edge", x, testing::TestPool(PoolType::kMax, 2, 3, 1, PoolConvention::kFull));
  ASSERT_OK(g.status());
  auto r = ExportOnnx(g, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("layer 'pool_edge': operator Pooling (max, MXNet's full "
                                      "rounding) has a last window that lies wholly in the "
                                      "padding, which has no ONNX mapping"),
            std::string::npos)
      << r.status();
}

TEST_F(OnnxExportTest, ParameterErrorsNameTheArrayTheLayerAndTheShapes) {
  Graph g = Build("lenet");
  OnnxExportOptions o;
  o.source = "lenet-0003.params";
  std::vector<NamedArray> arrays = RandomArrays(g);

  std::vector<NamedArray> missing = arrays;
  missing.erase(missing.begin() + 2);  // conv2_weight
  auto r = ExportOnnx(g, missing, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("lenet-0003.params has no array 'conv2_weight' (a parameter "
                                      "of layer 'conv2', shape (50,20,5,5))"),
            std::string::npos)
      << r.status();

  std::vector<NamedArray> wrong = arrays;
  wrong[6].shape = {10, 300};
  wrong[6].data.resize(3000);
  r = ExportOnnx(g, wrong, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lenet-0003.params: 'fc2_weight' has shape (10,300), but "
                                      "layer 'fc2' of the network wants (10,500)"),
            std::string::npos)
      << r.status();

  std::vector<NamedArray> extra = arrays;
  extra.push_back(arrays[0]);
  extra.back().name = "conv9_weight";
  r = ExportOnnx(g, extra, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("holds 'conv9_weight', which the network"), std::string::npos)
      << r.status();

  // A local run's checkpoint holds the momentum too: it is not the model's.
  std::vector<NamedArray> with_momentum = arrays;
  with_momentum.push_back(arrays[0]);
  with_momentum.back().kind = NamedArray::Kind::kOptimizerState;
  with_momentum.back().name = "conv1_weight_momentum";
  EXPECT_OK(ExportOnnx(g, with_momentum, o).status());

  std::vector<NamedArray> kind = arrays;
  kind[0].kind = NamedArray::Kind::kAux;
  r = ExportOnnx(g, kind, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'conv1_weight' is stored as an aux state"),
            std::string::npos)
      << r.status();
}

TEST_F(OnnxExportTest, UnreadableFilesAreErrorsNamingThePath) {
  auto r = ReadOnnxFile(dir_ + "/none.onnx");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string junk = dir_ + "/junk.onnx";
  FILE* f = std::fopen(junk.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  std::fputs("\xff\xff\xff not protobuf", f);
  std::fclose(f);
  r = ReadOnnxFile(junk);
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find(junk), std::string::npos);
  Graph g = Build("mlp");
  auto m = ExportOnnx(g, RandomArrays(g), {});
  ASSERT_TRUE(m.ok()) << m.status();
  Status s = WriteOnnxFile(*m, dir_ + "/no/such/dir/m.onnx");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_NE(s.message().find("/no/such/dir/m.onnx"), std::string::npos) << s;
}

// ---- `pstrain export` ----

int RunPstrain(const std::string& args, std::string* output) {
  const std::string cmd = testing::PstrainBinary() + " " + args + " 2>&1";
  return testing::RunShell(cmd, output);
}

TEST_F(OnnxExportTest, ExportCommandWritesTheModelOrSaysWhatIsWrong) {
  Graph g = Build("lenet");
  const std::string params = CheckpointParamsPath(dir_ + "/lenet", 2);
  ASSERT_OK(SaveArrays(params, RandomArrays(g)));
  std::string out;
  const std::string onnx_path = dir_ + "/lenet.onnx";
  ASSERT_EQ(RunPstrain("export --network lenet --params " + params + " --out " + onnx_path, &out),
            0)
      << out;
  EXPECT_NE(out.find("input data (N,1,28,28), output softmax (N,10), 11 nodes"), std::string::npos)
      << out;
  auto m = ReadOnnxFile(onnx_path);
  ASSERT_TRUE(m.ok()) << m.status();
  ExpectConsistent(g, RandomArrays(g), *m);
  EXPECT_FALSE(std::filesystem::exists(onnx_path + ".tmp"));

  // --model-prefix and --load-epoch name the same file.
  ASSERT_EQ(RunPstrain("export --network lenet --model-prefix " + dir_ +
                           "/lenet --load-epoch 2 --out " + dir_ + "/b.onnx",
                       &out),
            0)
      << out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/b.onnx"));
  // So does the --config file a run was trained with (flags still win).
  {
    std::ofstream cfg(dir_ + "/lenet.cfg");
    cfg << "network: \"lenet\"\nmodel_prefix: \"" << dir_ << "/lenet\"\nload_epoch: 2\n";
  }
  ASSERT_EQ(RunPstrain("export --config " + dir_ + "/lenet.cfg --out " + dir_ + "/cfg.onnx", &out),
            0)
      << out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/cfg.onnx"));
  EXPECT_EQ(RunPstrain("export --config " + dir_ + "/lenet.cfg --load-epoch 3 --out " + dir_ +
                           "/cfg3.onnx",
                       &out),
            1);
  EXPECT_NE(out.find("lenet-0003.params"), std::string::npos) << out;
  // An epoch no checkpoint has is named.
  EXPECT_EQ(RunPstrain("export --network lenet --model-prefix " + dir_ +
                           "/lenet --load-epoch -3 --out " + dir_ + "/neg.onnx",
                       &out),
            2);
  EXPECT_NE(out.find("(--load-epoch -3: the checkpoints count from 1)"), std::string::npos) << out;

  // Another network's parameters: the array, both shapes and the flags to check.
  EXPECT_EQ(RunPstrain("export --network lenet --num-classes 100 --params " + params + " --out " +
                           dir_ + "/c.onnx",
                       &out),
            1);
  EXPECT_NE(out.find("'fc2_weight' has shape (10,500), but layer 'fc2' of the network wants "
                     "(100,500)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("must be those the checkpoint was trained with"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/c.onnx"));

  EXPECT_EQ(RunPstrain("export --network lenet --params " + dir_ + "/none.params --out " + dir_ +
                           "/d.onnx",
                       &out),
            1);
  EXPECT_NE(out.find(dir_ + "/none.params"), std::string::npos) << out;
  EXPECT_EQ(RunPstrain("export --network lenet --out " + dir_ + "/e.onnx", &out), 2);
  EXPECT_NE(out.find("--params"), std::string::npos) << out;
  EXPECT_EQ(RunPstrain("export --network no-such-net --params " + params + " --out x.onnx", &out),
            2);
  EXPECT_NE(out.find("no-such-net"), std::string::npos) << out;
}

// Found by review: a network ending in global pooling has the same
// parameters at any input size, so a checkpoint trained at 32x32 exported
// without --image-shape got the default 28x28 input, and ONNX Runtime then
// refused the real images. Such a network needs --image-shape; lenet, whose
// parameters fix the size, does not (above).
TEST_F(OnnxExportTest, ANetworkWhoseParametersDoNotFixTheInputSizeNeedsTheShape) {
  Graph g = Build("inception-bn-28-small", Shape({3, 32, 32}));
  const std::string params = dir_ + "/incept-0001.params";
  ASSERT_OK(SaveArrays(params, RandomArrays(g)));
  std::string out;
  EXPECT_EQ(RunPstrain("export --network inception-bn-28-small --params " + params + " --out " +
                           dir_ + "/i.onnx",
                       &out),
            2);
  EXPECT_NE(out.find("--image-shape is required for inception-bn-28-small: its parameters do not "
                     "fix the input's height and width (its default is (3,28,28))"),
            std::string::npos)
      << out;
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/i.onnx"));
  ASSERT_EQ(RunPstrain("export --network inception-bn-28-small --image-shape 3,32,32 --params " +
                           params + " --out " + dir_ + "/i.onnx",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("input data (N,3,32,32)"), std::string::npos) << out;
}

}  // namespace
}  // namespace pstrain
