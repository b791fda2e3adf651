// ONNX export: a Graph (models/) with the arrays of a checkpoint
// (worker/checkpoint.h) as an ONNX model for inference, opset 13 (IR version 7),
// written with our own schema (proto/onnx_subset.proto).
//
// The model has one input per data input of the graph, "data" of shape
// [N, C, H, W] where N is the symbolic dimension "N" (any batch size), and one
// output, the graph's output: for the zoo the softmax probabilities [N, classes]
// named after the SoftmaxOutput ("softmax"). The label input is dropped. Each
// layer becomes the standard operators that compute what the engine computes in
// inference (Forward(is_train=false)):
//
//   Convolution     Conv (group, strides, pads; bias when the layer has one)
//   FullyConnected  Gemm (transB=1), after a Flatten when the input is an image
//   BatchNorm       BatchNormalization with the moving mean and variance and eps;
//                   fix_gamma layers get a scale of ones, as the engine uses
//   Activation      Relu, Tanh, Sigmoid
//   Pooling         MaxPool / AveragePool (count_include_pad=1); global pooling
//                   GlobalMaxPool / GlobalAveragePool. MXNet's "full" rounding
//                   (a last window that reaches past the padding) becomes extra
//                   padding at the end, excluded from maxima and divisors, so
//                   ceil_mode is never needed (readers disagree about it)
//   Concat          Concat along channels (axis 1)
//   ElementWiseSum  Add (two inputs) or Sum
//   Dropout         Identity (inference)
//   Flatten         Flatten (axis 1)
//   SoftmaxOutput   Softmax (axis 1), after a Flatten when the input is not flat
//
// Values are named after the layers that compute them, initializers after the
// parameters ("conv1_weight", "bn1_moving_mean").
#ifndef PSTRAIN_ONNX_ONNX_EXPORT_H_
#define PSTRAIN_ONNX_ONNX_EXPORT_H_

#include <string>
#include <vector>

#include "common/status.h"
#include "nn/graph.h"
#include "proto/onnx_subset.pb.h"
#include "worker/checkpoint.h"

namespace pstrain {

inline constexpr int kOnnxOpset = 13;
inline constexpr int kOnnxIrVersion = 7;  // the IR version of opset 13 (ONNX 1.8)

struct OnnxExportOptions {
  std::string graph_name = "pstrain";  // GraphProto.name: the network's name
  std::string producer_version;        // ModelProto.producer_version
  // Where `arrays` came from (the .params file), named in every error about them.
  std::string source = "the parameters";
};

// Builds the ONNX model of `graph` with the values of `arrays`, which must hold
// exactly the graph's parameters (kind kParam) and aux states (kAux) by name,
// each with the shape the graph gives it. Errors:
//   InvalidArgument  graph.status() is not ok; an array is missing, has another
//                    shape or kind than the network wants, or the file holds an
//                    array the network does not have (each names the array, the
//                    layer, both shapes and options.source);
//   Unimplemented    a layer whose operator has no ONNX mapping (names the
//                    layer and the operator).
StatusOr<onnx::ModelProto> ExportOnnx(const Graph& graph, const std::vector<NamedArray>& arrays,
                                      const OnnxExportOptions& options);

// Serializes `model` to `path` (through "<path>.tmp", renamed into place).
// IOError naming the path when it cannot be written.
Status WriteOnnxFile(const onnx::ModelProto& model, const std::string& path);

// Parses an ONNX file written by WriteOnnxFile (or any ONNX file: fields this
// schema lacks are kept as unknown). NotFound / Corruption naming the path.
StatusOr<onnx::ModelProto> ReadOnnxFile(const std::string& path);

}  // namespace pstrain

#endif  // PSTRAIN_ONNX_ONNX_EXPORT_H_
