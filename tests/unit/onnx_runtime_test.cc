// Exported models run in ONNX Runtime give what pstrain gives: LeNet trained
// briefly on MNIST and inception-bn-28-small on CIFAR-10 (the exact partial
// binary set, ../shared/data/cifar10_partial, and the whole test set of the
// JPEG copy, ../shared/data/cifar10_jpeg), each evaluated on its test set
// by pstrain (its own Validation-accuracy line, and an inference executor whose
// inputs and probabilities are dumped as raw floats) and by ONNX Runtime on the
// same inputs (a Python script this test writes): probabilities equal within
// float tolerance, accuracies within 0.1%. Also the layer variants no zoo model
// has (tests/unit/onnx_test_graphs.h) on random weights and inputs, and onnx's
// own checker on every file.
//
// ONNX Runtime and onnx come from pip into a virtual environment under the
// build tree, made once by the CTest fixture onnx_python_env
// (scripts/onnx_python_env.sh); where it could not be made (no package index),
// the tests skip with its reason.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "data/image_record_iter.h"
#include "models/models.h"
#include "nn/executor.h"
#include "nn/initializer.h"
#include "onnx/onnx_export.h"
#include "tests/test_util.h"
#include "tests/unit/onnx_test_graphs.h"
#include "worker/checkpoint.h"
#include "worker/train_config.h"
#include "worker/train_data.h"

namespace pstrain {
namespace {

// Reads the model with onnx (its checker, with shape inference) and runs it in
// ONNX Runtime on the raw float32 inputs in batches of 1, 7, then 256 (the
// batch dimension is symbolic), against the expected outputs.
constexpr char kCompareScript[] = R"PY(
import sys
import numpy as np
import onnxruntime as ort

args = dict(a.split("=", 1) for a in sys.argv[1:])
shape = [int(v) for v in args["shape"].split(",")]
x = np.fromfile(args["inputs"], dtype="<f4").reshape([-1] + shape)
want = np.fromfile(args["expected"], dtype="<f4").reshape(x.shape[0], -1)

try:
    import onnx
except ImportError:
    print("checker=unavailable")
else:
    onnx.checker.check_model(onnx.load(args["model"]), full_check=True)
    print("checker=ok")

opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
opts.inter_op_num_threads = 1
sess = ort.InferenceSession(args["model"], opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
print("input=%s%s" % (inp.name, [str(d) for d in inp.shape]))
print("output=%s" % sess.get_outputs()[0].name)
got, i, k, sizes = [], 0, 0, [1, 7, 256]
while i < len(x):
    n = sizes[min(k, len(sizes) - 1)]
    got.append(sess.run(None, {inp.name: x[i:i + n]})[0])
    i, k = i + n, k + 1
got = np.concatenate(got).reshape(want.shape)
diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
print("examples=%d" % len(x))
print("max_abs_diff=%.9g" % diff.max())
print("max_rel_diff=%.9g" % (diff / np.maximum(1.0, np.abs(want))).max())
print("argmax_agree=%d" % int((got.argmax(1) == want.argmax(1)).sum()))
print("mean_top_output=%.6g" % want.max(1).mean())
print("max_diff_over_top=%.9g" % (diff.max() / np.abs(want).max()))
if "labels" in args:
    labels = np.fromfile(args["labels"], dtype="<f4").astype(np.int64)
    print("onnx_correct=%d" % int((got.argmax(1) == labels).sum()))
)PY";

int RunCommand(const std::string& cmd, std::string* output) {
  return testing::RunShell(cmd + " 2>&1", output);
}

void WriteFloats(const std::string& path, const std::vector<float>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  ASSERT_TRUE(f.good()) << path;
}

// "key=value" lines of the script's output.
std::map<std::string, std::string> ParseKeyValues(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    size_t eq = line.find('=');
    if (eq != std::string::npos && line.find(' ') > eq)
      out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

// What pstrain computed on a data set: the inputs it read, its outputs, labels.
struct Evaluation {
  std::vector<float> inputs, outputs, labels;
  int64_t examples = 0;
  int64_t correct = 0;          // argmax(outputs) == label
  std::set<int64_t> predicted;  // the classes argmax(outputs) takes
};

int64_t Argmax(const float* p, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (p[i] > p[best]) best = i;
  }
  return best;
}

// Sets the executor's parameters and aux states from a checkpoint's arrays.
Status LoadArraysInto(const Graph& g, const std::vector<NamedArray>& arrays, Executor* e) {
  std::map<std::string, const NamedArray*> by_name;
  for (const NamedArray& a : arrays) by_name[a.name] = &a;
  for (size_t i = 0; i < g.params().size(); ++i) {
    const NamedArray* a = by_name.at(g.params()[i].name);
    RETURN_IF_ERROR(e->WriteParam(static_cast<int>(i), a->data.data(), a->data.size()));
  }
  for (size_t i = 0; i < g.aux_states().size(); ++i) {
    const NamedArray* a = by_name.at(g.aux_states()[i].name);
    RETURN_IF_ERROR(e->WriteAux(static_cast<int>(i), a->data.data(), a->data.size()));
  }
  return Status::Ok();
}

class OnnxRuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string venv = PSTRAIN_ONNX_VENV;
    python_ = venv + "/bin/python";
    if (!std::filesystem::exists(venv + "/ready")) {
      std::ifstream why(venv + ".unavailable");
      std::string reason((std::istreambuf_iterator<char>(why)), std::istreambuf_iterator<char>());
      if (reason.empty()) {
        reason =
            "it has not been made: run this test through ctest (fixture onnx_python_env) "
            "or bash scripts/onnx_python_env.sh " +
            venv;
      }
      GTEST_SKIP() << "no ONNX Runtime environment at " << venv << ": " << reason;
    }
    dir_ = testing::MakeTempDir("onnx-runtime");
    ASSERT_FALSE(dir_.empty());
    std::ofstream(dir_ + "/compare.py") << kCompareScript;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Runs the compare script; returns its key=value lines (empty on failure).
  std::map<std::string, std::string> Compare(const std::string& model, const Shape& shape,
                                             const Evaluation& ev) {
    WriteFloats(dir_ + "/inputs.f32", ev.inputs);
    WriteFloats(dir_ + "/expected.f32", ev.outputs);
    std::string cmd = python_ + " " + dir_ + "/compare.py model=" + model + " inputs=" + dir_ +
                      "/inputs.f32 expected=" + dir_ + "/expected.f32 shape=" +
                      shape.ToString().substr(1, shape.ToString().size() - 2);
    if (!ev.labels.empty()) {
      WriteFloats(dir_ + "/labels.f32", ev.labels);
      cmd += " labels=" + dir_ + "/labels.f32";
    }
    std::string out;
    const int rc = RunCommand(cmd, &out);
    EXPECT_EQ(rc, 0) << cmd << "\n" << out;
    if (rc != 0) return {};
    std::printf("%s", out.c_str());
    return ParseKeyValues(out);
  }

  // Inference with pstrain's executor over the validation set of a
  // `pstrain train` job's data, as its trainer reads it.
  Evaluation Evaluate(const Graph& g, const std::vector<NamedArray>& arrays,
                      const TrainConfig& cfg) {
    Evaluation ev;
    std::unique_ptr<DataIter> val;
    if (!cfg.data_val().empty()) {
      // The validation .rec as `pstrain train` reads it by default: centre
      // crop, MXNet's RGB mean subtracted.
      ImageRecordIterConfig ic;
      ic.path_imgrec = cfg.data_val();
      ic.batch_size = cfg.batch_size();
      auto dims = ParseIntList(cfg.image_shape(), "--image-shape");
      EXPECT_TRUE(dims.ok() && dims->size() == 3) << cfg.image_shape();
      if (!dims.ok() || dims->size() != 3) return ev;
      ic.aug.channels = static_cast<int>((*dims)[0]);
      ic.aug.out_height = static_cast<int>((*dims)[1]);
      ic.aug.out_width = static_cast<int>((*dims)[2]);
      const float mean[3] = {123.68f, 116.779f, 103.939f};
      std::copy(mean, mean + 3, ic.aug.mean_rgb);
      auto it = ImageRecordIter::Create(ic);
      EXPECT_TRUE(it.ok()) << it.status();
      if (!it.ok()) return ev;
      val = std::move(it).value();
    } else {
      auto data = OpenTrainData(cfg, 0, 1);
      EXPECT_TRUE(data.ok()) << data.status();
      if (!data.ok() || data->val == nullptr) return ev;
      val = std::move(data->val);
    }
    ExecutorOptions eo;
    eo.batch_size = cfg.batch_size();
    eo.for_training = false;
    auto exec = Executor::Create(g, eo);
    EXPECT_TRUE(exec.ok()) << exec.status();
    if (!exec.ok()) return ev;
    EXPECT_OK(LoadArraysInto(g, arrays, exec->get()));
    const int64_t classes = g.node(g.output()).out_shape.num_elements();
    std::vector<float> probs(static_cast<size_t>(cfg.batch_size() * classes));
    Batch b;
    val->Reset();
    while (true) {
      StatusOr<bool> more = val->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      EXPECT_OK((*exec)->LoadData(b.data.data(), b.data.size()));
      (*exec)->Forward(/*is_train=*/false);
      EXPECT_OK((*exec)->ReadOutput(probs.data(), probs.size()));
      const int64_t n = b.batch_size() - b.pad;
      const int64_t per = b.example_size();
      ev.inputs.insert(ev.inputs.end(), b.data.begin(), b.data.begin() + n * per);
      ev.outputs.insert(ev.outputs.end(), probs.begin(), probs.begin() + n * classes);
      for (int64_t i = 0; i < n; ++i) {
        ev.labels.push_back(b.label[i]);
        const int64_t top = Argmax(&probs[i * classes], classes);
        ev.correct += top == static_cast<int64_t>(b.label[i]);
        ev.predicted.insert(top);
      }
      ev.examples += n;
    }
    return ev;
  }

  // Trains `network` briefly with `pstrain train`, exports the checkpoint with
  // `pstrain export`, and compares pstrain and ONNX Runtime on the test set.
  // Sets pstrain's accuracy and the number of distinct classes it predicted.
  // `data` is a data folder, or "TRAIN.rec,VAL.rec" (RecordIO images, 10 classes).
  void TrainExportCompare(const std::string& network, const std::string& data,
                          const std::string& image_shape, int64_t num_examples, double* accuracy,
                          size_t* classes_predicted) {
    const std::string prefix = dir_ + "/" + network;
    const std::string shape_flag = image_shape.empty() ? "" : " --image-shape " + image_shape;
    const size_t comma = data.find(',');
    const bool rec = comma != std::string::npos;
    const std::string data_flags = rec ? " --num-classes 10 --data-train " + data.substr(0, comma) +
                                             " --data-val " + data.substr(comma + 1)
                                       : " --data-dir " + data;
    std::string out;
    const std::string train = testing::PstrainBinary() + " train --network " + network +
                              shape_flag + data_flags +
                              " --kv-store local --num-epochs 1 --batch-size 64 --num-examples " +
                              std::to_string(num_examples) + " --model-prefix " + prefix;
    ASSERT_EQ(RunCommand(train, &out), 0) << train << "\n" << out;
    const size_t at = out.find("Validation-accuracy=");
    ASSERT_NE(at, std::string::npos) << out;
    const double logged = std::stod(out.substr(at + std::strlen("Validation-accuracy=")));

    const std::string params = CheckpointParamsPath(prefix, 1);
    const std::string model = prefix + ".onnx";
    const std::string exp = testing::PstrainBinary() + " export --network " + network + shape_flag +
                            " --params " + params + " --out " + model;
    ASSERT_EQ(RunCommand(exp, &out), 0) << exp << "\n" << out;

    TrainConfig cfg;
    cfg.set_network(network);
    if (rec) {
      cfg.set_num_classes(10);
      cfg.set_data_train(data.substr(0, comma));
      cfg.set_data_val(data.substr(comma + 1));
    } else {
      cfg.set_data_dir(data);
    }
    cfg.set_image_shape(image_shape);
    cfg.set_batch_size(100);
    ModelOptions mo;
    mo.name = network;
    auto dims = ParseIntList(image_shape, "shape");
    ASSERT_TRUE(dims.ok());
    mo.image_shape = Shape(*dims);
    auto g = BuildModel(mo);
    ASSERT_TRUE(g.ok()) << g.status();
    auto arrays = LoadArrays(params);
    ASSERT_TRUE(arrays.ok()) << arrays.status();
    const Evaluation ev = Evaluate(*g, *arrays, cfg);
    ASSERT_GT(ev.examples, 0);
    const double ours = static_cast<double>(ev.correct) / static_cast<double>(ev.examples);
    // The executor here and the trainer's validation agree (same weights).
    EXPECT_NEAR(ours, logged, 1e-3) << "trainer logged Validation-accuracy=" << logged;

    auto r = Compare(model, g->node(g->input_nodes()[0]).out_shape, ev);
    ASSERT_FALSE(r.empty());
    EXPECT_EQ(r["checker"], "ok") << "onnx's checker did not run";
    EXPECT_EQ(r["input"].substr(0, 10), "data['N', ") << r["input"];
    EXPECT_EQ(r["output"], "softmax");
    ASSERT_EQ(std::stoll(r["examples"]), ev.examples);
    EXPECT_LE(std::stod(r["max_abs_diff"]), 1e-4) << "probabilities differ";
    const double onnx = std::stod(r["onnx_correct"]) / static_cast<double>(ev.examples);
    EXPECT_NEAR(onnx, ours, 1e-3);
    EXPECT_NEAR(onnx, logged, 1e-3);
    std::printf(
        "%s on %lld test examples: pstrain accuracy %.4f (logged %.4f), ONNX Runtime %.4f, "
        "argmax agreement %s, max |p - p'| %s\n",
        network.c_str(), static_cast<long long>(ev.examples), ours, logged, onnx,
        r["argmax_agree"].c_str(), r["max_abs_diff"].c_str());
    *accuracy = ours;
    *classes_predicted = ev.predicted.size();
  }

  std::string python_;
  std::string dir_;
};

TEST_F(OnnxRuntimeTest, LenetOnMnist) {
  double accuracy = 0;
  size_t classes = 0;
  TrainExportCompare("lenet", testing::SharedDataDir() + "/mnist", "1,28,28", 6400, &accuracy,
                     &classes);
  EXPECT_GT(accuracy, 0.8);  // it learned: the agreement is not on noise
  EXPECT_EQ(classes, 10u);
}

// Ten batches at 32x32 (the binary set has no crops): accuracy is low (the
// moving statistics are young), but the predictions vary, so agreeing on them
// is not agreeing on a constant.
TEST_F(OnnxRuntimeTest, InceptionBn28SmallOnCifar10) {
  double accuracy = 0;
  size_t classes = 0;
  TrainExportCompare("inception-bn-28-small", testing::SharedDataDir() + "/cifar10_partial",
                     "3,32,32", 640, &accuracy, &classes);
  EXPECT_GE(classes, 3u);
}

// The whole CIFAR-10 test set (10,000 images, the JPEG copy: the exact
// binary set is partial), packed by im2rec as they are, centre-cropped to
// 28x28 as the trainer's validation reads them; trained on 700 images.
TEST_F(OnnxRuntimeTest, InceptionBn28SmallOnTheWholeCifar10TestSet) {
  const std::string tarball = testing::SharedDataDir() + "/cifar10_jpeg/cifar10-jpeg.tar.gz";
  ASSERT_TRUE(std::filesystem::exists(tarball)) << tarball;
  const std::string images = dir_ + "/cifar10";
  std::filesystem::create_directories(images);
  std::string out;
  const std::string untar =
      "tar -xzf " + tarball + " -C " + images + " --wildcards 'train/*/00[0-6]?.jpg' 'test/*' 2>&1";
  ASSERT_EQ(RunCommand(untar, &out), 0) << out;
  for (const std::string part : {"train", "test"}) {
    const std::string prefix = dir_ + "/" + part, root = images + "/" + part;
    const std::string list =
        testing::PstrainBinary() + " im2rec --list --recursive " + prefix + " " + root + " 2>&1";
    ASSERT_EQ(RunCommand(list, &out), 0) << out;
    const std::string pack =
        testing::PstrainBinary() + " im2rec --pass-through " + prefix + " " + root + " 2>&1";
    ASSERT_EQ(RunCommand(pack, &out), 0) << out;
  }
  double accuracy = 0;
  size_t classes = 0;
  TrainExportCompare("inception-bn-28-small", dir_ + "/train.rec," + dir_ + "/test.rec", "3,28,28",
                     640, &accuracy, &classes);
  EXPECT_GE(classes, 3u);
}

// Every zoo model (testing::ZooCases) with Xavier weights, moving statistics
// and gammas drawn at random (a fix_gamma layer must ignore its stored gamma),
// on random images.
TEST_F(OnnxRuntimeTest, EveryZooModelMatchesOnRandomWeights) {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto spec = InitializerSpec::Parse("xavier(gaussian,in,2)");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (const testing::ZooCase& c : testing::ZooCases()) {
    SCOPED_TRACE(c.name + " " + c.shape.ToString());
    ModelOptions mo;
    mo.name = c.name;
    mo.image_shape = c.shape;
    mo.num_layers = c.num_layers;
    auto g = BuildModel(mo);
    ASSERT_TRUE(g.ok()) << g.status();
    const int batch = 3;
    ExecutorOptions eo;
    eo.batch_size = batch;
    eo.for_training = false;
    auto exec = Executor::Create(*g, eo);
    ASSERT_TRUE(exec.ok()) << exec.status();
    Executor& e = **exec;
    InitializeParams(*spec, /*seed=*/5, &e);
    std::vector<NamedArray> arrays;
    auto add = [&](const ParamInfo& info, NamedArray::Kind kind, int i) {
      NamedArray a;
      a.kind = kind;
      a.name = info.name;
      a.shape = info.shape.dims();
      a.data.resize(static_cast<size_t>(info.shape.num_elements()));
      if (kind == NamedArray::Kind::kParam && info.role != ParamRole::kGamma) {
        ASSERT_OK(e.ReadParam(i, a.data.data(), a.data.size()));
      } else {
        const float lo = info.role == ParamRole::kMovingMean ? -0.2f : 0.5f;
        for (float& v : a.data) v = lo + u(rng) * 0.5f;
        if (kind == NamedArray::Kind::kParam) {
          ASSERT_OK(e.WriteParam(i, a.data.data(), a.data.size()));
        } else {
          ASSERT_OK(e.WriteAux(i, a.data.data(), a.data.size()));
        }
      }
      arrays.push_back(std::move(a));
    };
    for (size_t i = 0; i < g->params().size(); ++i) {
      add(g->params()[i], NamedArray::Kind::kParam, static_cast<int>(i));
    }
    for (size_t i = 0; i < g->aux_states().size(); ++i) {
      add(g->aux_states()[i], NamedArray::Kind::kAux, static_cast<int>(i));
    }
    OnnxExportOptions opts;
    opts.graph_name = c.name;
    auto m = ExportOnnx(*g, arrays, opts);
    ASSERT_TRUE(m.ok()) << m.status();
    const std::string model = dir_ + "/zoo.onnx";
    ASSERT_OK(WriteOnnxFile(*m, model));

    Evaluation ev;
    const Shape& in = g->node(g->input_nodes()[0]).out_shape;
    ev.inputs.resize(static_cast<size_t>(batch * in.num_elements()));
    for (float& v : ev.inputs) v = u(rng);
    ASSERT_OK(e.LoadData(ev.inputs.data(), ev.inputs.size()));
    e.Forward(/*is_train=*/false);
    ev.outputs.resize(static_cast<size_t>(batch * g->node(g->output()).out_shape.num_elements()));
    ASSERT_OK(e.ReadOutput(ev.outputs.data(), ev.outputs.size()));
    ev.examples = batch;
    auto r = Compare(model, in, ev);
    ASSERT_FALSE(r.empty());
    EXPECT_EQ(r["checker"], "ok");
    // Relative to the largest probability: 1000-class models spread theirs thin.
    EXPECT_LE(std::stod(r["max_diff_over_top"]), 1e-4);
    EXPECT_EQ(r["argmax_agree"], std::to_string(batch));
  }
}

// Random weights (batch norm statistics included) and random inputs through
// every layer variant the zoo lacks, compared without a softmax.
TEST_F(OnnxRuntimeTest, OddLayersMatch) {
  Graph g = testing::OddLayersGraph();
  ASSERT_OK(g.status());
  const std::vector<NamedArray> arrays = testing::RandomArrays(g);
  auto m = ExportOnnx(g, arrays, {});
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string model = dir_ + "/odd.onnx";
  ASSERT_OK(WriteOnnxFile(*m, model));

  const int batch = 9;
  ExecutorOptions eo;
  eo.batch_size = batch;
  eo.for_training = false;
  auto exec = Executor::Create(g, eo);
  ASSERT_TRUE(exec.ok()) << exec.status();
  ASSERT_OK(LoadArraysInto(g, arrays, exec->get()));
  Evaluation ev;
  ev.inputs.resize(static_cast<size_t>(batch * g.node(0).out_shape.num_elements()));
  std::mt19937 rng(1702);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : ev.inputs) v = 2.0f * u(rng);
  ASSERT_OK((*exec)->LoadData(ev.inputs.data(), ev.inputs.size()));
  (*exec)->Forward(/*is_train=*/false);
  ev.outputs.resize(static_cast<size_t>(batch * g.node(g.output()).out_shape.num_elements()));
  ASSERT_OK((*exec)->ReadOutput(ev.outputs.data(), ev.outputs.size()));
  ev.examples = batch;

  auto r = Compare(model, g.node(0).out_shape, ev);
  ASSERT_FALSE(r.empty());
  EXPECT_EQ(r["checker"], "ok");
  EXPECT_EQ(r["output"], "bn_flat");
  EXPECT_LE(std::stod(r["max_rel_diff"]), 1e-5);
}

}  // namespace
}  // namespace pstrain
