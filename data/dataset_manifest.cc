#include "data/dataset_manifest.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/sha256.h"

namespace pstrain {
namespace {

namespace pb = google::protobuf;

// The MNIST files are the published originals (LeCun, Cortes, Burges): their
// md5 sums are the ones torchvision checks. Mirrors: torchvision's, the one of
// TensorFlow's tutorials, then the original site.
constexpr char kMnist[] = R"pb(
  name: "mnist"
  description: "MNIST handwritten digits: 60000 train + 10000 test images, 28x28 gray (idx .gz)"
  homepage: "http://yann.lecun.com/exdb/mnist/"
  mirror: "https://ossci-datasets.s3.amazonaws.com/mnist/"
  mirror: "https://storage.googleapis.com/cvdf-datasets/mnist/"
  mirror: "http://yann.lecun.com/exdb/mnist/"
  file {
    name: "train-images-idx3-ubyte.gz"
    size: 9912422
    sha256: "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
  }
  file {
    name: "train-labels-idx1-ubyte.gz"
    size: 28881
    sha256: "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
  }
  file {
    name: "t10k-images-idx3-ubyte.gz"
    size: 1648877
    sha256: "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"
  }
  file {
    name: "t10k-labels-idx1-ubyte.gz"
    size: 4542
    sha256: "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"
  }
)pb";

// The binary version (md5 c32a1d4ab5d03f1284b67883e8d87530 on the homepage);
// its SHA-256 is the one tensorflow/datasets records for the same URL and
// size. The archive holds cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin,
// 10000 records of 3073 bytes each.
constexpr char kCifar10[] = R"pb(
  name: "cifar10"
  description: "CIFAR-10: 50000 train + 10000 test images, 32x32 RGB, 10 classes (binary batches)"
  homepage: "https://www.cs.toronto.edu/~kriz/cifar.html"
  mirror: "https://www.cs.toronto.edu/~kriz/"
  file {
    name: "cifar-10-binary.tar.gz"
    size: 170052171
    sha256: "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"
    unpack: "tar.gz"
    strip_prefix: "cifar-10-batches-bin/"
  }
  provides { name: "data_batch_1.bin" size: 30730000 }
  provides { name: "data_batch_2.bin" size: 30730000 }
  provides { name: "data_batch_3.bin" size: 30730000 }
  provides { name: "data_batch_4.bin" size: 30730000 }
  provides { name: "data_batch_5.bin" size: 30730000 }
  provides { name: "test_batch.bin" size: 30730000 }
)pb";

class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

bool IsPlainName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

bool IsHexDigest(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

bool IsMirrorUrl(const std::string& s) {
  return s.rfind("http://", 0) == 0 || s.rfind("https://", 0) == 0 || s.rfind("file://", 0) == 0;
}

Status ValidateFile(const DatasetFile& f, const std::string& where, bool fetched) {
  if (!IsPlainName(f.name())) {
    return Status::InvalidArgument(StrCat(where, ": '", f.name(), "' is not a plain file name"));
  }
  if (f.size() < 0) {
    return Status::InvalidArgument(StrCat(where, ": ", f.name(), ": size ", f.size(), " < 0"));
  }
  if ((fetched || f.has_sha256()) && !IsHexDigest(f.sha256())) {
    return Status::InvalidArgument(
        StrCat(where, ": ", f.name(), ": sha256 '", f.sha256(), "' is not 64 hex digits"));
  }
  if (!f.unpack().empty() && f.unpack() != "tar.gz") {
    return Status::InvalidArgument(
        StrCat(where, ": ", f.name(), ": unpack '", f.unpack(), "' is not \"tar.gz\" (or empty)"));
  }
  return Status::Ok();
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::vector<std::string> BuiltinDatasets() { return {"cifar10", "mnist"}; }

StatusOr<DatasetManifest> BuiltinManifest(const std::string& name) {
  if (name == "mnist") return ParseManifest(kMnist, "built-in manifest mnist");
  if (name == "cifar10") return ParseManifest(kCifar10, "built-in manifest cifar10");
  std::string known;
  for (const std::string& n : BuiltinDatasets()) known += (known.empty() ? "" : ", ") + n;
  return Status::NotFound(StrCat("no built-in data set '", name, "' (known: ", known,
                                 "; others need --manifest FILE)"));
}

StatusOr<DatasetManifest> ParseManifest(const std::string& text, const std::string& where) {
  DatasetManifest m;
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &m)) {
    return Status::InvalidArgument(StrCat(where, ":", errors.first()));
  }
  for (DatasetFile& f : *m.mutable_file()) {
    if (f.has_sha256()) f.set_sha256(Lower(f.sha256()));
  }
  for (DatasetFile& f : *m.mutable_provides()) {
    if (f.has_sha256()) f.set_sha256(Lower(f.sha256()));
  }
  RETURN_IF_ERROR(ValidateManifest(m, where));
  return m;
}

StatusOr<DatasetManifest> ReadManifestFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat("manifest file ", path, " cannot be opened"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseManifest(text.str(), path);
}

StatusOr<DatasetManifest> FindManifest(const std::string& name_or_path) {
  auto builtin = BuiltinManifest(name_or_path);
  if (builtin.ok()) return builtin;
  struct stat st;
  if (::stat(name_or_path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    return ReadManifestFile(name_or_path);
  }
  return builtin.status();
}

std::string ManifestText(const DatasetManifest& manifest) {
  std::string out;
  pb::TextFormat::PrintToString(manifest, &out);
  return out;
}

Status ValidateManifest(const DatasetManifest& m, const std::string& where) {
  if (!IsPlainName(m.name())) {
    return Status::InvalidArgument(
        StrCat(where, ": name '", m.name(), "' must be a plain name (mnist, cifar10, ...)"));
  }
  if (m.file_size() == 0) {
    return Status::InvalidArgument(StrCat(where, ": data set ", m.name(), " has no file"));
  }
  for (const std::string& mirror : m.mirror()) {
    if (!IsMirrorUrl(mirror)) {
      return Status::InvalidArgument(
          StrCat(where, ": mirror '", mirror, "' is not an http://, https:// or file:// URL"));
    }
  }
  for (const DatasetFile& f : m.file()) RETURN_IF_ERROR(ValidateFile(f, where, true));
  for (const DatasetFile& f : m.provides()) {
    RETURN_IF_ERROR(ValidateFile(f, where + " (provides)", false));
    if (!f.unpack().empty()) {
      return Status::InvalidArgument(
          StrCat(where, ": provides ", f.name(), ": unpack applies to fetched files only"));
    }
  }
  return Status::Ok();
}

std::string MirrorUrl(const std::string& mirror, const std::string& dataset,
                      const std::string& file_name) {
  std::string base = mirror;
  for (size_t at; (at = base.find("{name}")) != std::string::npos;) {
    base.replace(at, 6, dataset);
  }
  if (base.empty() || base.back() != '/') base += '/';
  return base + file_name;
}

std::vector<DatasetFile> ProvidedFiles(const DatasetManifest& manifest) {
  if (manifest.provides_size() > 0) {
    return {manifest.provides().begin(), manifest.provides().end()};
  }
  std::vector<DatasetFile> out;
  for (const DatasetFile& f : manifest.file()) {
    if (f.unpack().empty()) out.push_back(f);
  }
  return out;
}

Status CheckDatasetReady(const DatasetManifest& manifest, const std::string& dir,
                         bool check_digests) {
  for (const DatasetFile& f : ProvidedFiles(manifest)) {
    const std::string path = dir + "/" + f.name();
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      return Status::NotFound(StrCat(dir, " lacks ", manifest.name(), " file ", f.name()));
    }
    if (f.size() > 0 && st.st_size != f.size()) {
      return Status::NotFound(
          StrCat(path, " has ", static_cast<int64_t>(st.st_size), " bytes, expected ", f.size()));
    }
    if (check_digests && !f.sha256().empty()) {
      ASSIGN_OR_RETURN(std::string got, Sha256FileHex(path));
      if (got != f.sha256()) {
        return Status::NotFound(
            StrCat(path, ": sha256 ", got, " does not match the expected ", f.sha256()));
      }
    }
  }
  return Status::Ok();
}

}  // namespace pstrain
