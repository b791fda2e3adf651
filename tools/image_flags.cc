#include "tools/image_flags.h"

#include <gflags/gflags.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "data/image_mean.h"

DEFINE_string(data_train, "",
              "the training data: a RecordIO file of image records (.rec; any name but *.lst), "
              "or a .lst image list");
DEFINE_string(data_train_idx, "", "the .idx file of --data-train (optional; else it is scanned)");
DEFINE_string(data_val, "",
              "the validation data (needs --data-train): a RecordIO file (any name but *.lst), "
              "or a .lst image list");
DEFINE_string(data_root, "",
              "folder that the image paths of a .lst --data-train/--data-val are relative to "
              "(default: the .lst's folder)");
DEFINE_string(data_val_idx, "", "the .idx file of --data-val (optional)");
DEFINE_string(rgb_mean, "123.68,116.779,103.939", "per-channel mean subtracted, R,G,B");
DEFINE_string(rgb_std, "1,1,1", "per-channel standard deviation divided by, R,G,B");
DEFINE_int32(pad_size, 0, "pixels of --fill-value padded on every side before cropping");
DEFINE_int32(fill_value, 127, "value of the padding pixels, 0..255");
DEFINE_int32(random_crop, 0, "1: crop at a random position (else the centre)");
DEFINE_int32(random_mirror, 0, "1: flip horizontally with probability 0.5");
DEFINE_int32(random_resized_crop, 0,
             "1: crop a random area and aspect ratio, then resize to the image shape");
DEFINE_double(min_random_area, 1.0,
              "smallest crop area (fraction of the image) with "
              "--random-resized-crop");
DEFINE_double(max_random_area, 1.0, "largest crop area with --random-resized-crop");
DEFINE_double(min_random_aspect_ratio, 0.0,
              "smallest aspect ratio (w/h) with "
              "--random-resized-crop; 0: the range is 1 -/+ --max-random-aspect-ratio");
DEFINE_double(max_random_aspect_ratio, 0.0,
              "largest aspect ratio (w/h); when "
              "--min-random-aspect-ratio is 0, the largest change of the ratio from 1");
DEFINE_int32(data_nthreads, 4, "threads that decode and augment images");
DEFINE_string(mean_img, "",
              "MXNet mean image file (NDArray list, key mean_img) subtracted instead of "
              "--rgb-mean; computed from --data-train and saved there when missing");

namespace pstrain {

namespace {

bool EndsWith(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() > n && s.compare(s.size() - n, n, suffix) == 0;
}

// The folder a .lst's image paths are relative to.
std::string RootOf(const std::string& lst) {
  return !FLAGS_data_root.empty() ? FLAGS_data_root
                                  : std::filesystem::path(lst).parent_path().string();
}

}  // namespace

Status ParseFloatTriple(const std::string& flag, const std::string& value, float out[3]) {
  size_t start = 0;
  for (int i = 0; i < 3; ++i) {
    size_t comma = value.find(',', start);
    if ((i < 2) != (comma != std::string::npos)) {
      return Status::InvalidArgument(
          StrCat("--", flag, "=", value, ": expected three comma-separated numbers"));
    }
    std::string part = value.substr(start, comma == std::string::npos ? comma : comma - start);
    char* end = nullptr;
    out[i] = std::strtof(part.c_str(), &end);
    if (part.empty() || *end != '\0') {
      return Status::InvalidArgument(
          StrCat("--", flag, "=", value, ": '", part, "' is not a number"));
    }
    start = comma + 1;
  }
  return Status::Ok();
}

namespace {

// Loads --mean-img, or computes it over all of --data-train (centre crops) and
// saves it, as MXNet's ImageRecordIter does when the file is missing.
StatusOr<std::vector<float>> LoadOrComputeMeanImage(const ImageRecordIterConfig& cfg) {
  const AugmentConfig& aug = cfg.aug;
  const std::vector<int64_t> shape = {aug.channels, aug.out_height, aug.out_width};
  std::error_code ec;
  if (std::filesystem::exists(FLAGS_mean_img, ec)) {
    ASSIGN_OR_RETURN(MeanImage mean, LoadMeanImage(FLAGS_mean_img));
    if (mean.shape != shape) {
      return Status::InvalidArgument(
          StrCat("--mean-img=", FLAGS_mean_img, " is ", mean.shape[0], "x", mean.shape[1], "x",
                 mean.shape[2], ", the data shape is ", shape[0], "x", shape[1], "x", shape[2]));
    }
    return std::move(mean.data);
  }
  ImageRecordIterConfig train = cfg;
  if (EndsWith(FLAGS_data_train, ".lst")) {
    train.path_imgrec.clear();
    train.path_imgidx.clear();
    train.path_imglist = FLAGS_data_train;
    train.path_root = RootOf(FLAGS_data_train);
  } else {
    train.path_imglist.clear();
    train.path_imgrec = FLAGS_data_train;
    train.path_imgidx = FLAGS_data_train_idx;
  }
  train.part_index = 0;
  train.num_parts = 1;
  LOG(INFO) << "--mean-img=" << FLAGS_mean_img << " is missing: computing it over "
            << FLAGS_data_train;
  MeanImage mean;
  mean.shape = shape;
  ASSIGN_OR_RETURN(mean.data, ComputeMeanImage(train));
  // Written under a temporary name and renamed, so workers that compute it at
  // the same time never read a half-written file.
  const std::string tmp = StrCat(FLAGS_mean_img, ".tmp.", cfg.part_index);
  RETURN_IF_ERROR(SaveMeanImage(tmp, mean));
  std::filesystem::rename(tmp, FLAGS_mean_img, ec);
  if (ec) {
    return Status::IOError(StrCat("renaming ", tmp, " to ", FLAGS_mean_img, ": ", ec.message()));
  }
  LOG(INFO) << "saved the mean image to " << FLAGS_mean_img;
  return std::move(mean.data);
}

}  // namespace

StatusOr<ImageRecordIterConfig> ImageRecordIterConfigFromFlags(ImageDataSplit split, int batch_size,
                                                               int64_t channels, int64_t height,
                                                               int64_t width, int part_index,
                                                               int num_parts, uint64_t seed) {
  if ((channels != 1 && channels != 3) || height < 1 || height > 65535 || width < 1 ||
      width > 65535) {
    return Status::InvalidArgument(StrCat("image shape ", channels, ",", height, ",", width,
                                          ": need 1 or 3 channels and sides of 1 to 65535"));
  }
  const bool train = split == ImageDataSplit::kTrain;
  ImageRecordIterConfig cfg;
  const std::string& path = train ? FLAGS_data_train : FLAGS_data_val;
  if (path.empty()) {
    return Status::NotFound(train ? "--data-train is empty" : "--data-val is empty");
  }
  if (EndsWith(path, ".lst")) {
    cfg.path_imglist = path;
    cfg.path_root = RootOf(path);
  } else {
    cfg.path_imgrec = path;
    cfg.path_imgidx = train ? FLAGS_data_train_idx : FLAGS_data_val_idx;
  }
  cfg.batch_size = batch_size;
  cfg.shuffle = train;
  cfg.seed = seed;
  cfg.part_index = part_index;
  cfg.num_parts = num_parts;
  cfg.preprocess_threads = FLAGS_data_nthreads;
  AugmentConfig& aug = cfg.aug;
  aug.channels = static_cast<int>(channels);
  aug.out_height = static_cast<int>(height);
  aug.out_width = static_cast<int>(width);
  RETURN_IF_ERROR(ParseFloatTriple("rgb-mean", FLAGS_rgb_mean, aug.mean_rgb));
  RETURN_IF_ERROR(ParseFloatTriple("rgb-std", FLAGS_rgb_std, aug.std_rgb));
  if (channels == 1) {  // gray images use the first mean and std
    aug.mean_rgb[1] = aug.mean_rgb[2] = aug.mean_rgb[0];
    aug.std_rgb[1] = aug.std_rgb[2] = aug.std_rgb[0];
  }
  aug.fill_value = FLAGS_fill_value;
  if (train) {
    aug.pad = FLAGS_pad_size;
    aug.rand_crop = FLAGS_random_crop != 0;
    aug.rand_mirror = FLAGS_random_mirror != 0;
    aug.random_resized_crop = FLAGS_random_resized_crop != 0;
    aug.min_random_area = static_cast<float>(FLAGS_min_random_area);
    aug.max_random_area = static_cast<float>(FLAGS_max_random_area);
    if (FLAGS_min_random_aspect_ratio > 0) {
      aug.min_aspect_ratio = static_cast<float>(FLAGS_min_random_aspect_ratio);
      aug.max_aspect_ratio = static_cast<float>(FLAGS_max_random_aspect_ratio);
    } else {
      if (FLAGS_max_random_aspect_ratio < 0 || FLAGS_max_random_aspect_ratio >= 1) {
        return Status::InvalidArgument(
            StrCat("--max-random-aspect-ratio=", FLAGS_max_random_aspect_ratio,
                   ": without --min-random-aspect-ratio it is a change of the ratio in [0, 1)"));
      }
      aug.min_aspect_ratio = static_cast<float>(1 - FLAGS_max_random_aspect_ratio);
      aug.max_aspect_ratio = static_cast<float>(1 + FLAGS_max_random_aspect_ratio);
    }
  }
  RETURN_IF_ERROR(cfg.Validate());
  if (!FLAGS_mean_img.empty()) {
    ASSIGN_OR_RETURN(aug.mean_image, LoadOrComputeMeanImage(cfg));
  }
  return cfg;
}

}  // namespace pstrain
