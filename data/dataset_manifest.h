// Data set manifests (proto/dataset.proto): which files make a data set, their
// sizes and SHA-256 digests, and the mirrors to fetch them from. Built in:
// mnist and cifar10; any other comes from a manifest file.
#ifndef PSTRAIN_DATA_DATASET_MANIFEST_H_
#define PSTRAIN_DATA_DATASET_MANIFEST_H_

#include <string>
#include <vector>

#include "common/status.h"
#include "proto/dataset.pb.h"

namespace pstrain {

// The names of the built-in data sets, sorted: {"cifar10", "mnist"}.
std::vector<std::string> BuiltinDatasets();
// A built-in manifest; NotFound listing the known names otherwise.
StatusOr<DatasetManifest> BuiltinManifest(const std::string& name);

// Parses protobuf text (`where` names it in errors: "file.txt") and checks it
// with ValidateManifest.
StatusOr<DatasetManifest> ParseManifest(const std::string& text, const std::string& where);
StatusOr<DatasetManifest> ReadManifestFile(const std::string& path);
// A built-in name, else the manifest file `name_or_path` names; NotFound
// listing the built-in names when it is neither.
StatusOr<DatasetManifest> FindManifest(const std::string& name_or_path);
// The manifest as protobuf text, for `pstrain data manifest`.
std::string ManifestText(const DatasetManifest& manifest);

// InvalidArgument naming `where` and the field when: the name is empty or not
// a plain name; a file has no name, a name with '/', a size < 0, a digest
// that is not 64 hex digits, or an unpack other than "" and "tar.gz"; a
// mirror is not an http://, https:// or file:// URL; there are no files.
Status ValidateManifest(const DatasetManifest& manifest, const std::string& where);

// The URL of `file_name` under `mirror`: "{name}" in the mirror is replaced by
// `dataset`, and a '/' is put between the two when the mirror lacks one.
std::string MirrorUrl(const std::string& mirror, const std::string& dataset,
                      const std::string& file_name);

// The files a ready folder holds: the manifest's `provides`, or else its
// fetched files that are not unpacked.
std::vector<DatasetFile> ProvidedFiles(const DatasetManifest& manifest);

// Ok when `dir` holds every provided file with the right size (and, when
// `check_digests`, the right SHA-256 where the manifest gives one).
// Otherwise NotFound naming the folder and the first file missing or wrong
// (size or digest, expected vs got).
Status CheckDatasetReady(const DatasetManifest& manifest, const std::string& dir,
                         bool check_digests);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_DATASET_MANIFEST_H_
