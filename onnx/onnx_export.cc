#include "onnx/onnx_export.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>

namespace pstrain {
namespace {

// raw_data is little-endian; we copy floats as they lie in memory.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "ONNX raw_data needs little-endian floats");

using onnx::AttributeProto;
using onnx::GraphProto;
using onnx::NodeProto;
using onnx::TensorProto;
using onnx::ValueInfoProto;

const char* KindName(NamedArray::Kind kind) {
  switch (kind) {
    case NamedArray::Kind::kParam:
      return "a parameter";
    case NamedArray::Kind::kAux:
      return "an aux state";
    case NamedArray::Kind::kOptimizerState:
      return "an optimizer state";
  }
  return "an array of unknown kind";
}

void SetInt(NodeProto* n, const char* name, int64_t v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INT);
  a->set_i(v);
}

void SetInts(NodeProto* n, const char* name, const std::vector<int64_t>& v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

void SetFloat(NodeProto* n, const char* name, float v) {
  AttributeProto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(AttributeProto::FLOAT);
  a->set_f(v);
}

void SetShape(ValueInfoProto* v, const std::string& name, const Shape& per_sample) {
  v->set_name(name);
  onnx::TypeProto::Tensor* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(TensorProto::FLOAT);
  onnx::TensorShapeProto* s = t->mutable_shape();
  s->add_dim()->set_dim_param("N");
  for (int64_t d : per_sample.dims()) s->add_dim()->set_dim_value(d);
}

// Builds the GraphProto of one Graph, layer by layer.
class GraphWriter {
 public:
  GraphWriter(const Graph& graph, GraphProto* out) : graph_(graph), out_(out) {}

  // The parameters' and aux states' arrays, in the graph's orders.
  void set_arrays(std::vector<const NamedArray*> params, std::vector<const NamedArray*> aux) {
    params_ = std::move(params);
    aux_ = std::move(aux);
  }

  Status Write() {
    std::vector<bool> is_label(graph_.nodes().size(), false);
    for (const Node& n : graph_.nodes()) {
      if (n.op == OpType::kSoftmaxOutput && n.inputs.size() > 1) is_label[n.inputs[1]] = true;
    }
    // Names of every value first, so helper values never take a layer's or a
    // parameter's name.
    for (const Node& n : graph_.nodes()) used_.insert(n.name);
    for (const ParamInfo& p : graph_.params()) used_.insert(p.name);
    for (const ParamInfo& a : graph_.aux_states()) used_.insert(a.name);
    std::vector<bool> fixed_gamma(graph_.params().size(), false);
    for (const Node& n : graph_.nodes()) {
      if (n.op == OpType::kBatchNorm && n.bn.fix_gamma) fixed_gamma[n.params[0]] = true;
    }
    for (size_t i = 0; i < graph_.params().size(); ++i) {
      const ParamInfo& p = graph_.params()[i];
      if (fixed_gamma[i]) {
        // The engine multiplies by 1 whatever the stored gamma holds.
        const std::vector<float> ones(static_cast<size_t>(p.shape.num_elements()), 1.0f);
        AddFloats(p.name, p.shape, ones.data());
      } else {
        AddFloats(p.name, p.shape, params_[i]->data.data());
      }
    }
    for (size_t i = 0; i < graph_.aux_states().size(); ++i) {
      const ParamInfo& a = graph_.aux_states()[i];
      AddFloats(a.name, a.shape, aux_[i]->data.data());
    }
    for (const Node& n : graph_.nodes()) {
      if (n.op == OpType::kInput) {
        if (!is_label[n.id]) SetShape(out_->add_input(), n.name, n.out_shape);
        continue;
      }
      RETURN_IF_ERROR(WriteLayer(n));
    }
    const Node& last = graph_.node(graph_.output());
    SetShape(out_->add_output(), last.name, last.out_shape);
    return Status::Ok();
  }

 private:
  // A name for a helper value or node of `layer` that no other value has.
  std::string HelperName(const std::string& layer, const char* what) {
    std::string name = layer + "_" + what;
    for (int k = 2; used_.count(name) != 0; ++k) name = StrCat(layer, "_", what, k);
    used_.insert(name);
    return name;
  }

  NodeProto* AddNode(const char* op, const std::string& name, std::vector<std::string> inputs,
                     const std::string& output) {
    NodeProto* n = out_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (std::string& in : inputs) n->add_input(std::move(in));
    n->add_output(output);
    return n;
  }

  void AddFloats(const std::string& name, const Shape& shape, const float* data) {
    TensorProto* t = out_->add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::FLOAT);
    for (int64_t d : shape.dims()) t->add_dims(d);
    t->set_raw_data(data, static_cast<size_t>(shape.num_elements()) * sizeof(float));
  }

  void AddInt64s(const std::string& name, const std::vector<int64_t>& values) {
    TensorProto* t = out_->add_initializer();
    t->set_name(name);
    t->set_data_type(TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }

  // The value holding node `id`'s output flattened to (N, features): the
  // output itself when it is flat already, else a Flatten of it.
  std::string Flat(NodeId id, const std::string& layer) {
    const Node& in = graph_.node(id);
    if (in.out_shape.ndim() == 1) return in.name;
    const std::string name = HelperName(layer, "flatten");
    SetInt(AddNode("Flatten", name, {in.name}, name), "axis", 1);
    return name;
  }

  Status WriteLayer(const Node& n) {
    const std::string& x = graph_.node(n.inputs[0]).name;
    switch (n.op) {
      case OpType::kConvolution: {
        std::vector<std::string> ins = {x, graph_.params()[n.params[0]].name};
        if (n.params.size() > 1) ins.push_back(graph_.params()[n.params[1]].name);
        NodeProto* c = AddNode("Conv", n.name, std::move(ins), n.name);
        const ConvParam& p = n.conv;
        SetInts(c, "kernel_shape", {p.kernel_h, p.kernel_w});
        SetInts(c, "strides", {p.stride_h, p.stride_w});
        SetInts(c, "pads", {p.pad_h, p.pad_w, p.pad_h, p.pad_w});
        SetInts(c, "dilations", {1, 1});
        SetInt(c, "group", p.num_group);
        return Status::Ok();
      }
      case OpType::kFullyConnected: {
        std::vector<std::string> ins = {Flat(n.inputs[0], n.name),
                                        graph_.params()[n.params[0]].name};
        if (n.params.size() > 1) ins.push_back(graph_.params()[n.params[1]].name);
        SetInt(AddNode("Gemm", n.name, std::move(ins), n.name), "transB", 1);
        return Status::Ok();
      }
      case OpType::kBatchNorm: {
        NodeProto* b =
            AddNode("BatchNormalization", n.name,
                    {x, graph_.params()[n.params[0]].name, graph_.params()[n.params[1]].name,
                     graph_.aux_states()[n.aux[0]].name, graph_.aux_states()[n.aux[1]].name},
                    n.name);
        SetFloat(b, "epsilon", n.bn.eps);
        return Status::Ok();
      }
      case OpType::kActivation: {
        const char* op = n.act == ActType::kRelu   ? "Relu"
                         : n.act == ActType::kTanh ? "Tanh"
                                                   : "Sigmoid";
        AddNode(op, n.name, {x}, n.name);
        return Status::Ok();
      }
      case OpType::kPooling:
        return WritePooling(n, x);
      case OpType::kConcat: {
        std::vector<std::string> ins;
        for (NodeId in : n.inputs) ins.push_back(graph_.node(in).name);
        SetInt(AddNode("Concat", n.name, std::move(ins), n.name), "axis", 1);
        return Status::Ok();
      }
      case OpType::kAdd: {
        std::vector<std::string> ins;
        for (NodeId in : n.inputs) ins.push_back(graph_.node(in).name);
        const char* op = ins.size() == 1 ? "Identity" : ins.size() == 2 ? "Add" : "Sum";
        AddNode(op, n.name, std::move(ins), n.name);
        return Status::Ok();
      }
      case OpType::kDropout:
        AddNode("Identity", n.name, {x}, n.name);
        return Status::Ok();
      case OpType::kFlatten:
        SetInt(AddNode("Flatten", n.name, {x}, n.name), "axis", 1);
        return Status::Ok();
      case OpType::kSoftmaxOutput:
        SetInt(AddNode("Softmax", n.name, {Flat(n.inputs[0], n.name)}, n.name), "axis", 1);
        return Status::Ok();
      default:
        break;
    }
    return Status::Unimplemented(
        StrCat("layer '", n.name, "': operator ", OpTypeName(n.op), " has no ONNX mapping"));
  }

  // Floor rounding maps directly. MXNet's "full" rounding may add a last
  // window that reaches past the padded input by `extra` rows/columns; ONNX
  // pads at the end make that window, and are kept out of the maximum and
  // (with count_include_pad=0) out of the divisor, which is how the engine
  // clips such a window. An average's symmetric padding, which the engine
  // does count, then becomes an explicit Pad of zeros before the pool.
  Status WritePooling(const Node& n, const std::string& x) {
    const PoolParam& p = n.pool;
    const bool is_max = p.type == PoolType::kMax;
    if (p.global) {
      AddNode(is_max ? "GlobalMaxPool" : "GlobalAveragePool", n.name, {x}, n.name);
      return Status::Ok();
    }
    const Shape& in = graph_.node(n.inputs[0]).out_shape;
    const int64_t extra_h = std::max<int64_t>(
        0, (n.out_shape[1] - 1) * p.stride_h + p.kernel_h - (in[1] + 2 * p.pad_h));
    const int64_t extra_w = std::max<int64_t>(
        0, (n.out_shape[2] - 1) * p.stride_w + p.kernel_w - (in[2] + 2 * p.pad_w));
    std::string src = x;
    std::vector<int64_t> pads = {p.pad_h, p.pad_w, p.pad_h, p.pad_w};
    const bool spills = extra_h > 0 || extra_w > 0;
    if (spills && is_max) {
      // pad + extra >= kernel means the last window starts past the input:
      // a maximum over padding alone, which has no defined value (and ONNX
      // readers require each pad to be smaller than the kernel).
      if (p.pad_h + extra_h >= p.kernel_h || p.pad_w + extra_w >= p.kernel_w) {
        return Status::Unimplemented(StrCat(
            "layer '", n.name, "': operator ", OpTypeName(n.op),
            " (max, MXNet's full rounding) has a last window that lies wholly in the padding, "
            "which has no ONNX mapping"));
      }
      pads = {p.pad_h, p.pad_w, p.pad_h + extra_h, p.pad_w + extra_w};
    } else if (spills) {
      pads = {0, 0, extra_h, extra_w};
      if (p.pad_h > 0 || p.pad_w > 0) {
        src = HelperName(n.name, "pad");
        const std::string amounts = HelperName(n.name, "pads");
        AddInt64s(amounts, {0, 0, p.pad_h, p.pad_w, 0, 0, p.pad_h, p.pad_w});
        AddNode("Pad", src, {x, amounts}, src);
      }
    }
    NodeProto* pool = AddNode(is_max ? "MaxPool" : "AveragePool", n.name, {src}, n.name);
    SetInts(pool, "kernel_shape", {p.kernel_h, p.kernel_w});
    SetInts(pool, "strides", {p.stride_h, p.stride_w});
    SetInts(pool, "pads", pads);
    if (!is_max) SetInt(pool, "count_include_pad", spills ? 0 : 1);
    return Status::Ok();
  }

  const Graph& graph_;
  GraphProto* out_;
  std::vector<const NamedArray*> params_, aux_;
  std::set<std::string> used_;
};

// Finds each of `infos` (parameters or aux states) in `by_name`.
Status MatchArrays(const Graph& graph, const std::vector<ParamInfo>& infos, NamedArray::Kind kind,
                   const std::map<std::string, const NamedArray*>& by_name,
                   const std::string& source, std::vector<const NamedArray*>* out) {
  for (const ParamInfo& info : infos) {
    const std::string& layer = graph.node(info.node).name;
    auto it = by_name.find(info.name);
    if (it == by_name.end()) {
      return Status::InvalidArgument(StrCat(source, " has no array '", info.name, "' (",
                                            KindName(kind), " of layer '", layer, "', shape ",
                                            info.shape.ToString(), ")"));
    }
    const NamedArray& a = *it->second;
    if (a.kind != kind) {
      return Status::InvalidArgument(StrCat(source, ": '", info.name, "' is stored as ",
                                            KindName(a.kind), ", but layer '", layer,
                                            "' has it as ", KindName(kind)));
    }
    if (a.shape != info.shape.dims()) {
      return Status::InvalidArgument(StrCat(source, ": '", info.name, "' has shape ",
                                            Shape(a.shape).ToString(), ", but layer '", layer,
                                            "' of the network wants ", info.shape.ToString()));
    }
    if (a.data.size() != static_cast<size_t>(info.shape.num_elements())) {
      return Status::InvalidArgument(StrCat(source, ": '", info.name, "' holds ", a.data.size(),
                                            " values for shape ", info.shape.ToString()));
    }
    out->push_back(&a);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<onnx::ModelProto> ExportOnnx(const Graph& graph, const std::vector<NamedArray>& arrays,
                                      const OnnxExportOptions& options) {
  RETURN_IF_ERROR(graph.status());
  if (graph.output() == kInvalidNode) return Status::InvalidArgument("the network is empty");
  std::map<std::string, const NamedArray*> by_name;
  for (const NamedArray& a : arrays) {
    if (!by_name.emplace(a.name, &a).second) {
      return Status::InvalidArgument(
          StrCat(options.source, " holds the array '", a.name, "' twice"));
    }
  }
  std::vector<const NamedArray*> params, aux;
  RETURN_IF_ERROR(MatchArrays(graph, graph.params(), NamedArray::Kind::kParam, by_name,
                              options.source, &params));
  RETURN_IF_ERROR(MatchArrays(graph, graph.aux_states(), NamedArray::Kind::kAux, by_name,
                              options.source, &aux));
  // A checkpoint's optimizer state (the momentum) has no place in the model.
  const size_t states =
      static_cast<size_t>(std::count_if(arrays.begin(), arrays.end(), [](const NamedArray& a) {
        return a.kind == NamedArray::Kind::kOptimizerState;
      }));
  if (params.size() + aux.size() + states != arrays.size()) {
    std::set<std::string> wanted;
    for (const ParamInfo& p : graph.params()) wanted.insert(p.name);
    for (const ParamInfo& p : graph.aux_states()) wanted.insert(p.name);
    for (const NamedArray& a : arrays) {
      if (a.kind != NamedArray::Kind::kOptimizerState && wanted.count(a.name) == 0) {
        return Status::InvalidArgument(StrCat(options.source, " holds '", a.name,
                                              "', which the network ", options.graph_name,
                                              " does not have (another network's parameters?)"));
      }
    }
  }

  onnx::ModelProto model;
  model.set_ir_version(kOnnxIrVersion);
  model.set_producer_name("pstrain");
  model.set_producer_version(options.producer_version);
  model.set_model_version(1);
  model.set_doc_string(StrCat("pstrain ", options.graph_name, " from ", options.source));
  onnx::OperatorSetIdProto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOnnxOpset);
  GraphProto* g = model.mutable_graph();
  g->set_name(options.graph_name);
  GraphWriter writer(graph, g);
  writer.set_arrays(std::move(params), std::move(aux));
  RETURN_IF_ERROR(writer.Write());
  return model;
}

Status WriteOnnxFile(const onnx::ModelProto& model, const std::string& path) {
  std::string bytes;
  if (!model.SerializeToString(&bytes)) {
    return Status::Internal(
        StrCat("cannot serialize the ONNX model for ", path, " (larger than protobuf's 2 GiB?)"));
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::IOError(StrCat("cannot open ", tmp, " for writing"));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      return Status::IOError(StrCat("cannot write ", bytes.size(), " bytes to ", tmp));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return Status::IOError(StrCat("cannot rename ", tmp, " to ", path, ": ", why));
  }
  return Status::Ok();
}

StatusOr<onnx::ModelProto> ReadOnnxFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::NotFound(StrCat("cannot open ONNX file ", path));
  std::ostringstream bytes;
  bytes << f.rdbuf();
  onnx::ModelProto model;
  if (!model.ParseFromString(bytes.str())) {
    return Status::Corruption(StrCat(path, " is not an ONNX model (protobuf parse failed, ",
                                     bytes.str().size(), " bytes)"));
  }
  return model;
}

}  // namespace pstrain
