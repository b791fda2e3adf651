// pstrain imageio: reads --data-train through the ImageRecordIter with the
// augmentation flags of image_flags.cc and reports images/s of the pipeline
// alone, like fit.py's --test-io (which `pstrain train` answers the same way).
#include <gflags/gflags.h>

#include <chrono>
#include <cstdio>

#include "data/image_record_iter.h"
#include "tools/commands.h"
#include "tools/image_flags.h"
#include "worker/train_config.h"

DEFINE_int32(io_batch_size, 128, "imageio: examples per batch");
DEFINE_string(io_image_shape, "3,28,28", "imageio: output shape C,H,W");
DEFINE_int32(io_epochs, 1, "imageio: passes over the data");
DEFINE_int64(io_max_batches, 0, "imageio: stop a pass after this many batches (0: whole pass)");
DEFINE_int32(io_part_index, 0, "imageio: this reader's part of the file");
DEFINE_int32(io_num_parts, 1, "imageio: number of parts the file is split into");
DEFINE_uint64(io_seed, 0, "imageio: seed of the shuffle and the augmentation");

namespace pstrain {

int RunImageIo(int argc, char** argv) {
  auto shape = ParseIntList(FLAGS_io_image_shape, "--io-image-shape");
  if (shape.ok() && shape->size() != 3) {
    shape = Status::InvalidArgument(
        StrCat("--io-image-shape='", FLAGS_io_image_shape, "' must be C,H,W"));
  }
  if (!shape.ok()) {
    std::fprintf(stderr, "imageio: %s\n", shape.status().ToString().c_str());
    return 2;
  }
  auto cfg = ImageRecordIterConfigFromFlags(ImageDataSplit::kTrain, FLAGS_io_batch_size,
                                            (*shape)[0], (*shape)[1], (*shape)[2],
                                            FLAGS_io_part_index, FLAGS_io_num_parts, FLAGS_io_seed);
  if (!cfg.ok()) {
    std::fprintf(stderr, "imageio: %s\n", cfg.status().ToString().c_str());
    return 2;
  }
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  auto iter = ImageRecordIter::Create(*cfg);
  if (!iter.ok()) {
    std::fprintf(stderr, "imageio: %s\n", iter.status().ToString().c_str());
    return 1;
  }
  std::printf("imageio: %s (opened in %.3f s)\n", (*iter)->Describe().c_str(),
              std::chrono::duration<double>(Clock::now() - t0).count());
  std::printf("%6s %9s %9s %9s %12s\n", "epoch", "batches", "images", "seconds", "images/s");
  Batch batch;
  for (int epoch = 0; epoch < FLAGS_io_epochs; ++epoch) {
    (*iter)->Reset();
    auto start = Clock::now();
    int64_t batches = 0, images = 0;
    while (FLAGS_io_max_batches <= 0 || batches < FLAGS_io_max_batches) {
      auto more = (*iter)->Next(&batch);
      if (!more.ok()) {
        std::fprintf(stderr, "imageio: %s\n", more.status().ToString().c_str());
        return 1;
      }
      if (!*more) break;
      ++batches;
      images += batch.batch_size() - batch.pad;
    }
    double secs = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf("%6d %9lld %9lld %9.3f %12.0f\n", epoch, static_cast<long long>(batches),
                static_cast<long long>(images), secs, secs > 0 ? images / secs : 0.0);
  }
  return 0;
}

}  // namespace pstrain
