// The mean image file of MXNet's ImageRecordIter (`mean_img=mean.bin`): an
// NDArray list file (uint64 magic 0x112, uint64 reserved, uint64 count, the
// arrays, uint64 count, the names) holding one float32 array named "mean_img".
// Reads array records of format V2 (magic 0xF993FAC9, dense storage, int64
// dims), V1 (0xF993FAC8, int64 dims) and the 2015 legacy format (uint32 dims);
// writes V2 on cpu(0).
#ifndef PSTRAIN_DATA_IMAGE_MEAN_H_
#define PSTRAIN_DATA_IMAGE_MEAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace pstrain {

struct MeanImage {
  std::vector<int64_t> shape;  // {C, H, W}
  std::vector<float> data;     // C * H * W, CHW
};

// Reads the array named "mean_img" (or the only array). A file that is not an
// NDArray list, a non-float32 or sparse array, or a truncated file is an error
// naming the file and byte offset.
StatusOr<MeanImage> LoadMeanImage(const std::string& path);

// Writes `mean` as an NDArray list file with one array named "mean_img".
Status SaveMeanImage(const std::string& path, const MeanImage& mean);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IMAGE_MEAN_H_
