#include "worker/train_data.h"

#include <utility>

#include "data/cifar10.h"
#include "data/in_memory_iter.h"
#include "data/mnist.h"
#include "data/synthetic_iter.h"
#include "worker/train_config.h"

namespace pstrain {

StatusOr<TrainData> OpenTrainData(const TrainConfig& cfg, int rank, int num_workers) {
  ASSIGN_OR_RETURN(std::vector<int64_t> want_shape,
                   ParseIntList(cfg.image_shape(), "--image-shape"));
  IterOptions opts;
  opts.batch_size = cfg.batch_size();
  opts.part_index = rank;
  opts.num_parts = num_workers;
  opts.seed = cfg.seed();
  TrainData out;
  if (cfg.benchmark() != 0) {
    out.kind = "synthetic";
    out.image_shape = want_shape;
    out.num_classes = cfg.num_classes() > 0 ? cfg.num_classes() : 10;
    out.total_train_examples =
        cfg.num_examples() > 0 ? cfg.num_examples() : int64_t{100} * cfg.batch_size();
    ASSIGN_OR_RETURN(out.train, NewSyntheticIter(out.image_shape, out.num_classes,
                                                 out.total_train_examples, opts));
    return out;
  }

  std::shared_ptr<const ExampleSet> train_set, val_set;
  const std::string& dir = cfg.data_dir();
  auto mnist_images = FindMnistFile(dir, "train-images-idx3-ubyte");
  if (mnist_images.ok()) {
    out.kind = "mnist";
    ASSIGN_OR_RETURN(std::string labels, FindMnistFile(dir, "train-labels-idx1-ubyte"));
    ASSIGN_OR_RETURN(ExampleSet train, ReadMnist(*mnist_images, labels));
    train_set = std::make_shared<const ExampleSet>(std::move(train));
    auto val_images = FindMnistFile(dir, "t10k-images-idx3-ubyte");
    if (val_images.ok()) {
      ASSIGN_OR_RETURN(std::string val_labels, FindMnistFile(dir, "t10k-labels-idx1-ubyte"));
      ASSIGN_OR_RETURN(ExampleSet val, ReadMnist(*val_images, val_labels));
      val_set = std::make_shared<const ExampleSet>(std::move(val));
    }
  } else {
    auto cifar = FindCifar10Files(dir, true);
    if (!cifar.ok()) {
      return Status::NotFound(StrCat("--data-dir ", dir,
                                     " holds neither MNIST idx files (train-images-idx3-ubyte"
                                     "[.gz]) nor CIFAR-10 batches (data_batch_*.bin)"));
    }
    out.kind = "cifar10";
    ASSIGN_OR_RETURN(ExampleSet train, ReadCifar10(*cifar));
    train_set = std::make_shared<const ExampleSet>(std::move(train));
    auto val_files = FindCifar10Files(dir, false);
    if (val_files.ok()) {
      ASSIGN_OR_RETURN(ExampleSet val, ReadCifar10(*val_files));
      val_set = std::make_shared<const ExampleSet>(std::move(val));
    }
  }
  out.image_shape = train_set->shape;
  if (!want_shape.empty() && want_shape != out.image_shape) {
    return Status::InvalidArgument(StrCat("--image-shape=", cfg.image_shape(), " but the ",
                                          out.kind, " data in ", dir, " is ", out.image_shape[0],
                                          ",", out.image_shape[1], ",", out.image_shape[2],
                                          " (no cropping for this format)"));
  }
  out.num_classes = cfg.num_classes() > 0 ? cfg.num_classes() : 10;
  out.total_train_examples = train_set->count();
  IterOptions train_opts = opts;
  train_opts.shuffle = cfg.shuffle_train() != 0;
  ASSIGN_OR_RETURN(out.train,
                   NewInMemoryIter(train_set, train_opts,
                                   out.kind == "mnist" ? "MNIST train" : "CIFAR-10 train"));
  if (val_set != nullptr) {
    ASSIGN_OR_RETURN(
        out.val, NewInMemoryIter(val_set, opts,
                                 out.kind == "mnist" ? "MNIST validation" : "CIFAR-10 validation"));
  }
  return out;
}

}  // namespace pstrain
