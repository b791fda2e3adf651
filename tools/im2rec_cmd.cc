// pstrain im2rec: MXNet's tools/im2rec.py. With --list it writes .lst files for
// the images under ROOT; otherwise it packs PREFIX.lst (or every PREFIX*.lst)
// into .rec + .idx files beside it.
#include <gflags/gflags.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

#include "data/im2rec.h"
#include "tools/commands.h"

DEFINE_bool(list, false, "make .lst files from the images under ROOT instead of packing");
DEFINE_bool(recursive, false, "with --list: walk sub-folders, one label per folder of images");
DEFINE_bool(shuffle, true, "with --list: shuffle the image list (seeded, as im2rec.py)");
DEFINE_double(train_ratio, 1.0, "with --list: fraction of images in PREFIX_train.lst");
DEFINE_double(test_ratio, 0.0, "with --list: fraction of images in PREFIX_test.lst");
DEFINE_string(exts, ".jpeg,.jpg,.png", "with --list: image file extensions");
DEFINE_int32(resize, 0, "when packing: resize the shorter side to this many pixels (0: keep)");
DEFINE_int32(quality, 95, "when packing: JPEG quality of re-encoded images");
DEFINE_bool(center_crop, false, "when packing: crop the centre square first");
DEFINE_bool(pass_through, false, "when packing: store the image files unchanged");
DEFINE_bool(pack_label, false, "when packing: store every label of a .lst line");
DEFINE_int32(num_thread, 1, "when packing: threads that read and encode images");

namespace pstrain {
namespace fs = std::filesystem;

int RunIm2rec(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: pstrain im2rec [flags] PREFIX ROOT\n"
                 "  --list [--recursive] ...   write PREFIX.lst (or _train/_val/_test)\n"
                 "  (no --list)                pack PREFIX.lst or every PREFIX*.lst\n"
                 "see `pstrain im2rec --help` for the flags\n");
    return 2;
  }
  const std::string prefix = argv[1], root = argv[2];
  if (FLAGS_list) {
    MakeListOptions opts;
    opts.recursive = FLAGS_recursive;
    opts.shuffle = FLAGS_shuffle;
    opts.train_ratio = FLAGS_train_ratio;
    opts.test_ratio = FLAGS_test_ratio;
    opts.exts.clear();
    std::stringstream ss(FLAGS_exts);
    for (std::string e; std::getline(ss, e, ',');) {
      if (!e.empty()) opts.exts.push_back(e);
    }
    auto written = MakeImageLists(prefix, root, opts);
    if (!written.ok()) {
      std::fprintf(stderr, "im2rec: %s\n", written.status().ToString().c_str());
      return 1;
    }
    for (const std::string& p : *written) std::printf("im2rec: wrote %s\n", p.c_str());
    return 0;
  }

  std::vector<std::string> lists;
  std::error_code exists_ec;  // the non-throwing call: a path it cannot check is "not there"
  if (fs::exists(prefix + ".lst", exists_ec)) {
    lists.push_back(prefix + ".lst");
  } else {
    fs::path dir = fs::path(prefix).parent_path();
    if (dir.empty()) dir = ".";
    const std::string base = fs::path(prefix).filename().string();
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(base, 0) == 0 && it->path().extension() == ".lst") {
        lists.push_back(it->path().string());
      }
    }
    std::sort(lists.begin(), lists.end());
  }
  if (lists.empty()) {
    std::fprintf(stderr, "im2rec: no %s.lst or %s*.lst to pack (make one with --list)\n",
                 prefix.c_str(), prefix.c_str());
    return 1;
  }
  PackOptions opts;
  opts.resize = FLAGS_resize;
  opts.quality = FLAGS_quality;
  opts.center_crop = FLAGS_center_crop;
  opts.pass_through = FLAGS_pass_through;
  opts.pack_label = FLAGS_pack_label;
  opts.num_threads = FLAGS_num_thread;
  for (const std::string& lst : lists) {
    const std::string stem = lst.substr(0, lst.size() - 4);
    auto start = std::chrono::steady_clock::now();
    PackStats stats;
    Status s = PackImageList(lst, root, stem + ".rec", stem + ".idx", opts, &stats);
    if (!s.ok()) {
      std::fprintf(stderr, "im2rec: %s\n", s.ToString().c_str());
      return 1;
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("im2rec: %s.rec: %lld records, %lld skipped, %.2f s (%.0f images/s)\n",
                stem.c_str(), static_cast<long long>(stats.written),
                static_cast<long long>(stats.skipped), secs,
                secs > 0 ? (stats.written + stats.skipped) / secs : 0.0);
  }
  return 0;
}

}  // namespace pstrain
