// Getting a data set into a folder (`pstrain data get`) and finding the folder
// that holds one (`pstrain data locate`, `train --dataset`).
//
// Search order for data set NAME (first folder that holds it wins):
//   $PSTRAIN_MNIST_DIR            mnist only; set but incomplete is an error
//   $PSTRAIN_DATA/NAME
//   datasets/NAME                 relative to the working directory
//   ../shared/data/NAME           the project's machines keep the data sets there
// and when none does, it is fetched into $PSTRAIN_DATA/NAME, else datasets/NAME.
#ifndef PSTRAIN_DATA_DATASET_GET_H_
#define PSTRAIN_DATA_DATASET_GET_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/env.h"
#include "common/status.h"
#include "data/http_fetch.h"
#include "proto/dataset.pb.h"

namespace pstrain {

struct GetOptions {
  FetchOptions fetch;
  // Tried instead of the manifest's mirrors when not empty ("{name}" stands
  // for the data set's name).
  std::vector<std::string> mirrors;
  // How long to wait for another process fetching into the same folder.
  int64_t lock_timeout_ms = 60 * 60 * 1000;
};

struct GetReport {
  bool already_there = false;         // nothing had to be fetched
  std::vector<FetchResult> fetched;   // one per file fetched
  std::vector<std::string> unpacked;  // files unpacked from archives
};

// Makes `dir` (created if missing) hold the data set: files already there
// with the right digest are kept, others are fetched (manifest mirrors or
// options.mirrors, in order) and archives unpacked; then the provided files
// are checked. One process at a time per folder (a lock file,
// "<dir>/.pstrain-get.lock"; the others wait, up to lock_timeout_ms, and
// then find the data set there). A file that cannot be fetched is an error
// listing every mirror's failure followed by OfflineHelp().
Status GetDataset(const DatasetManifest& manifest, const std::string& dir,
                  const GetOptions& options, GetReport* report);

// Text for a user without a connection: which files to put where, their sizes
// and digests, the URLs they come from, and how to use a mirror of one's own.
std::string OfflineHelp(const DatasetManifest& manifest, const std::string& dir,
                        const std::vector<std::string>& mirrors);

// The folders searched, in order, each with what put it on the list
// ("PSTRAIN_DATA", "datasets/", ...).
std::vector<std::pair<std::string, std::string>> DatasetSearchPath(const std::string& name,
                                                                   const DataEnv& env);
// Where a data set is fetched to when none of the search path holds it.
std::string DefaultDatasetDir(const std::string& name, const DataEnv& env);

struct Located {
  std::string dir;
  // The search-path entry, "fetched", or "fetched by another process" (it
  // was complete once the folder's lock was ours).
  std::string origin;
  GetReport report;  // what GetDataset did, when fetched
};

// The first folder of the search path that holds the data set (provided
// files present, sizes right); otherwise, when `download`, fetches it into
// DefaultDatasetDir. Without `download`, NotFound naming the folders searched
// with OfflineHelp. PSTRAIN_MNIST_DIR set to a folder that lacks MNIST is
// NotFound naming the variable.
StatusOr<Located> LocateDataset(const DatasetManifest& manifest, const DataEnv& env, bool download,
                                const GetOptions& options);

// For `train --dataset`: with `data_dir`, that folder, the data set fetched
// into it when it lacks it (origin "--data-dir"); without, LocateDataset.
StatusOr<Located> EnsureDataset(const DatasetManifest& manifest, const std::string& data_dir,
                                const DataEnv& env, const GetOptions& options);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_DATASET_GET_H_
