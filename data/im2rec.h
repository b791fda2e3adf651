// im2rec: image folders and .lst files to RecordIO, like MXNet's
// tools/im2rec.py (../shared/reference/mxnet_facts.md 3.4).
//
// A .lst line is "index\tlabel[\tlabel...]\trelative/path.jpg". A folder
// listed recursively gives one class per sub-folder that holds images, numbered
// in sorted walk order (for class/file.jpg trees: the sorted class names).
#ifndef PSTRAIN_DATA_IM2REC_H_
#define PSTRAIN_DATA_IM2REC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

struct ImageListEntry {
  int64_t index = 0;
  std::vector<float> labels;
  std::string path;  // relative to the image root
};

// Lists the images under `root` whose lower-case extension is in `exts`
// (".jpg" ...), in sorted walk order, indices counting from 0. Recursive: the
// label is the number of the folder holding the image; otherwise only the
// files of `root` itself, label 0.
StatusOr<std::vector<ImageListEntry>> ListImageFolder(const std::string& root, bool recursive,
                                                      const std::vector<std::string>& exts);

Status WriteImageList(const std::string& path, const std::vector<ImageListEntry>& entries);
// A malformed line is InvalidArgument naming file:line.
StatusOr<std::vector<ImageListEntry>> ReadImageList(const std::string& path);

struct MakeListOptions {
  bool recursive = true;
  bool shuffle = true;
  uint64_t seed = 100;  // im2rec.py seeds its shuffle with 100
  double train_ratio = 1.0;
  double test_ratio = 0.0;
  std::vector<std::string> exts = {".jpeg", ".jpg", ".png"};
};

// Writes prefix.lst (train_ratio 1) or prefix_train.lst, prefix_val.lst (when
// train + test < 1) and prefix_test.lst (test_ratio > 0), splitting the
// (shuffled) list in that order: test first, then train, then val, as
// im2rec.py does. Returns the paths written.
StatusOr<std::vector<std::string>> MakeImageLists(const std::string& prefix,
                                                  const std::string& root,
                                                  const MakeListOptions& options);

struct PackOptions {
  int resize = 0;             // shorter side in pixels; 0 keeps the size
  int quality = 95;           // JPEG quality of re-encoded images
  bool center_crop = false;   // crop the centre square before resizing
  bool pass_through = false;  // store the file's bytes unchanged (no decode)
  bool pack_label = false;    // store every label of the line (flag = count)
  int num_threads = 1;
};

struct PackStats {
  int64_t written = 0;
  int64_t skipped = 0;  // unreadable or undecodable images (logged)
};

// Packs the images of `lst_path` (paths relative to `root`) into `rec_path`
// with a .idx at `idx_path` (key = the list index), in list order.
// Unreadable images are skipped with a warning and counted, as im2rec.py does;
// if every one is (a wrong `root`, say), NotFound and the files at
// `rec_path` and `idx_path` stay as they were.
Status PackImageList(const std::string& lst_path, const std::string& root,
                     const std::string& rec_path, const std::string& idx_path,
                     const PackOptions& options, PackStats* stats);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IM2REC_H_
