// The data and augmentation flags of MXNet's image-classification scripts
// (common/data.py: add_data_args, add_data_aug_args) that the image pipeline
// implements, and the one function that turns them into an ImageRecordIter
// configuration. Batch size, image shape, rank and seed belong to the training
// command's flags and come in as parameters.
#ifndef PSTRAIN_TOOLS_IMAGE_FLAGS_H_
#define PSTRAIN_TOOLS_IMAGE_FLAGS_H_

#include <gflags/gflags_declare.h>

#include <cstdint>
#include <string>

#include "common/status.h"
#include "data/image_record_iter.h"

DECLARE_string(data_train);
DECLARE_string(data_train_idx);
DECLARE_string(data_val);
DECLARE_string(data_val_idx);
DECLARE_string(data_root);
DECLARE_string(rgb_mean);
DECLARE_string(rgb_std);
DECLARE_int32(pad_size);
DECLARE_int32(fill_value);
DECLARE_int32(random_crop);
DECLARE_int32(random_mirror);
DECLARE_int32(random_resized_crop);
DECLARE_double(min_random_area);
DECLARE_double(max_random_area);
DECLARE_double(min_random_aspect_ratio);
DECLARE_double(max_random_aspect_ratio);
DECLARE_int32(data_nthreads);
DECLARE_string(mean_img);

namespace pstrain {

enum class ImageDataSplit { kTrain, kVal };

// The ImageRecordIter configuration for --data-train (kTrain: shuffled,
// random crop / resized crop / mirror / pad as flagged) or --data-val (kVal:
// centre crop, no mirror, no shuffle), both partitioned into `num_parts` with
// this worker's `part_index`, as fit.py does. `channels`, `height` and `width`
// are the output image shape (--image-shape: 1 or 3 channels, sides of 1 to
// 65535 pixels, else InvalidArgument). With --mean-img the mean image
// replaces --rgb-mean (loaded, or computed over --data-train and saved when the
// file is missing: one decoding pass). A malformed flag value is
// InvalidArgument naming the flag; an empty --data-val is NotFound.
StatusOr<ImageRecordIterConfig> ImageRecordIterConfigFromFlags(ImageDataSplit split, int batch_size,
                                                               int64_t channels, int64_t height,
                                                               int64_t width, int part_index,
                                                               int num_parts, uint64_t seed);

// Parses "a,b,c" into exactly three floats (--rgb-mean, --rgb-std).
Status ParseFloatTriple(const std::string& flag, const std::string& value, float out[3]);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_IMAGE_FLAGS_H_
