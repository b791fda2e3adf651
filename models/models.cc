#include "models/models.h"

#include <functional>
#include <optional>

#include "models/builders.h"

namespace pstrain {

namespace {

struct ModelEntry {
  const char* name;
  Shape default_shape;
  int default_classes;
  std::function<Status(const ModelOptions&, Graph*)> build;
};

// A fresh table per call: no process-wide state below tools/.
std::vector<ModelEntry> Registry() {
  return {
      {"mlp", {1, 28, 28}, 10, models::BuildMlp},
      {"lenet", {1, 28, 28}, 10, models::BuildLenet},
      {"inception-bn-28-small", {3, 28, 28}, 10, models::BuildInceptionBn28Small},
      {"inception-bn", {3, 224, 224}, 1000, models::BuildInceptionBn},
      {"resnet", {3, 224, 224}, 1000, models::BuildResnet},
      {"inception-v3", {3, 299, 299}, 1000, models::BuildInceptionV3},
      {"keras-mnist-cnn", {1, 28, 28}, 10, models::BuildKerasMnistCnn},
      {"neon-cifar10-conv", {3, 32, 32}, 10, models::BuildNeonCifar10Conv},
  };
}

std::optional<ModelEntry> FindModel(const std::string& name) {
  for (const ModelEntry& m : Registry()) {
    if (name == m.name) return m;
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> KnownModels() {
  std::vector<std::string> names;
  for (const ModelEntry& m : Registry()) names.push_back(m.name);
  return names;
}

Shape DefaultImageShape(const std::string& name) {
  std::optional<ModelEntry> m = FindModel(name);
  return m ? m->default_shape : Shape();
}

int DefaultNumClasses(const std::string& name) {
  std::optional<ModelEntry> m = FindModel(name);
  return m ? m->default_classes : 0;
}

StatusOr<Graph> BuildModel(const ModelOptions& options) {
  std::optional<ModelEntry> m = FindModel(options.name);
  if (!m) {
    std::string known;
    for (const std::string& n : KnownModels()) known += (known.empty() ? "" : ", ") + n;
    return Status::InvalidArgument(
        StrCat("unknown network '", options.name, "' (known: ", known, ")"));
  }
  ModelOptions o = options;
  if (o.image_shape.ndim() == 0) o.image_shape = m->default_shape;
  if (o.image_shape.ndim() != 3 || o.image_shape.num_elements() < 1) {
    return Status::InvalidArgument(StrCat("network '", o.name, "': image shape ",
                                          o.image_shape.ToString(), " is not (C,H,W)"));
  }
  if (o.num_classes == 0) {
    o.num_classes = m->default_classes;
    // An ImageNet-sized default on a CIFAR/MNIST-sized image (resnet picks its
    // CIFAR variant there): 10 classes, as MXNet's train_cifar10.py sets.
    if (o.num_classes == 1000 && o.image_shape[1] <= 32) o.num_classes = 10;
  }
  if (o.num_classes < 1) {
    return Status::InvalidArgument(StrCat("network '", o.name, "': num_classes must be >= 1"));
  }
  Graph g;
  Status s = m->build(o, &g);
  if (s.ok()) s = g.status();
  if (!s.ok()) {
    return s.WithContext(
        StrCat("network '", o.name, "' with image shape ", o.image_shape.ToString()));
  }
  return g;
}

}  // namespace pstrain
