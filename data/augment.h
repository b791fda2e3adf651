// Image augmentation as MXNet's ImageRecordIter does it (default augmenter,
// ../shared/reference/mxnet_facts.md 3.1 and 3.3), producing normalized float
// CHW straight into a batch buffer.
//
// Order of operations for one image of H x W:
//   1. resize: if resize > 0, the shorter side becomes `resize` (bilinear);
//   2. pad: `pad` pixels of `fill_value` on every side;
//   3. crop to the output C x out_height x out_width:
//        random_resized_crop: area fraction in [min_random_area, max_random_area]
//          and aspect ratio (w/h) log-uniform in [min_aspect_ratio,
//          max_aspect_ratio], up to 10 tries, else a centre crop of the whole
//          image; the window is resized to the output;
//        rand_crop: top-left uniform in [0, H-h] x [0, W-w];
//        otherwise: the centre ((H-h)/2, (W-w)/2);
//      an image smaller than the output (without random_resized_crop) is an error;
//   4. normalize: out = (pixel - mean) / std * scale, with a per-channel mean
//      (mean_rgb) or, when mean_image is set, a per-pixel C x h x w mean of
//      the crop;
//   5. mirror: horizontal flip with probability 0.5 when rand_mirror, after
//      the normalization as in MXNet, so that a flipped pixel has had its own
//      place's mean image value subtracted, not that of the place it lands on.
// Every random choice comes from the Rng passed in, so a fixed seed gives the
// same output on any thread.
#ifndef PSTRAIN_DATA_AUGMENT_H_
#define PSTRAIN_DATA_AUGMENT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "data/image_codec.h"

namespace pstrain {

struct AugmentConfig {
  int channels = 3;  // 3: RGB, 1: gray
  int out_height = 0;
  int out_width = 0;
  int resize = 0;  // shorter side before cropping; 0: keep
  int pad = 0;
  int fill_value = 255;  // MXNet ImageRecordIter's default (fit.py's --fill-value is 127)
  bool rand_crop = false;
  bool rand_mirror = false;
  bool random_resized_crop = false;
  float min_random_area = 1.0f;
  float max_random_area = 1.0f;
  float min_aspect_ratio = 1.0f;
  float max_aspect_ratio = 1.0f;
  float mean_rgb[3] = {0.0f, 0.0f, 0.0f};
  float std_rgb[3] = {1.0f, 1.0f, 1.0f};
  float scale = 1.0f;
  // C x out_height x out_width; when non-empty it replaces mean_rgb.
  std::vector<float> mean_image;

  // InvalidArgument naming the field when a value is out of range.
  Status Validate() const;
};

// A small, fast, seedable generator (splitmix64).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi]. REQUIRES: lo <= hi.
  int UniformInt(int lo, int hi) {
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

// The crop and flip chosen for one image of in_height x in_width (after
// resize and pad).
struct CropPlan {
  Rect window;  // in the resized, padded image
  bool mirror = false;
};

// Chooses the crop window and mirror for an image of the given size. An image
// smaller than the output without random_resized_crop is InvalidArgument whose
// message starts with `where`.
Status PlanCrop(const AugmentConfig& cfg, int in_height, int in_width, Rng* rng,
                std::string_view where, CropPlan* plan);

// Writes `window` of `src` (bilinearly resized to the output size when the
// sizes differ), mirrored if asked, normalized, to `out` as C x out_height x
// out_width floats. REQUIRES: window inside src; src.channels == cfg.channels.
void WriteNormalized(const AugmentConfig& cfg, const Image& src, Rect window, bool mirror,
                     float* out);

// Per-thread state for AugmentImage: the decoder and reusable buffers.
struct AugmentScratch {
  ImageDecoder decoder;
  Image decoded;
  Image work;
};

// Decodes `encoded` and runs steps 1-5 above into `out` (C x out_height x
// out_width floats). Decodes only the rows and columns the crop needs, at a
// reduced DCT scale when the crop is much larger than the output.
// Errors (not an image, corrupt, smaller than the crop) start with `where`.
Status AugmentImage(const AugmentConfig& cfg, std::string_view encoded, std::string_view where,
                    Rng* rng, AugmentScratch* scratch, float* out);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_AUGMENT_H_
