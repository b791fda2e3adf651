// MNIST idx files (../shared/reference/mxnet_facts.md 3.4): big-endian int32
// header (images: magic 2051, count, rows, cols; labels: magic 2049, count),
// then bytes. Raw or gzipped.
#ifndef PSTRAIN_DATA_MNIST_H_
#define PSTRAIN_DATA_MNIST_H_

#include <memory>
#include <string>

#include "common/status.h"
#include "data/data_iter.h"
#include "data/in_memory_iter.h"

namespace pstrain {

// Reads an images file and its labels file into {1, rows, cols} examples.
// Corruption naming the file and byte offset for a wrong magic, a truncated
// file, a count mismatch between the two files, or a label >= 10.
StatusOr<ExampleSet> ReadMnist(const std::string& images_path, const std::string& labels_path);

// The path of `name` in `dir`: `name` itself if present, else `name`.gz;
// NotFound naming both when neither exists.
StatusOr<std::string> FindMnistFile(const std::string& dir, const std::string& name);

// A reader over `dir`'s train-* (train = true) or t10k-* files.
StatusOr<std::unique_ptr<DataIter>> NewMnistIter(const std::string& dir, bool train,
                                                 const IterOptions& opts);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_MNIST_H_
