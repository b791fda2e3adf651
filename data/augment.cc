#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pstrain {

Status AugmentConfig::Validate() const {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(StrCat("data shape: channels must be 1 or 3, got ", channels));
  }
  if (out_height <= 0 || out_width <= 0) {
    return Status::InvalidArgument(
        StrCat("data shape: height and width must be positive, got ", out_height, "x", out_width));
  }
  if (resize < 0 || pad < 0) {
    return Status::InvalidArgument(
        StrCat("resize (", resize, ") and pad size (", pad, ") must not be negative"));
  }
  // An image side is at most 65535: so is what is added to one (2 * pad
  // overflowed an int past 2^30).
  if (pad > 32767) {
    return Status::InvalidArgument(StrCat("pad size ", pad,
                                          " is over 32767 (twice it must fit an image "
                                          "side of at most 65535)"));
  }
  if (fill_value < 0 || fill_value > 255) {
    return Status::InvalidArgument(StrCat("fill value must be in [0, 255], got ", fill_value));
  }
  if (random_resized_crop) {
    if (!(min_random_area > 0 && min_random_area <= max_random_area && max_random_area <= 1)) {
      return Status::InvalidArgument(StrCat("random area range [", min_random_area, ", ",
                                            max_random_area, "] must satisfy 0 < min <= max <= 1"));
    }
    if (!(min_aspect_ratio > 0 && min_aspect_ratio <= max_aspect_ratio)) {
      return Status::InvalidArgument(StrCat("aspect ratio range [", min_aspect_ratio, ", ",
                                            max_aspect_ratio, "] must satisfy 0 < min <= max"));
    }
  }
  for (int c = 0; c < channels; ++c) {
    if (std_rgb[c] == 0.0f) return Status::InvalidArgument(StrCat("rgb std ", c, " is zero"));
  }
  if (!mean_image.empty() &&
      mean_image.size() != static_cast<size_t>(channels) * out_height * out_width) {
    return Status::InvalidArgument(StrCat("mean image has ", mean_image.size(),
                                          " values; the data shape needs ",
                                          channels * out_height * out_width));
  }
  return Status::Ok();
}

Status PlanCrop(const AugmentConfig& cfg, int in_height, int in_width, Rng* rng,
                std::string_view where, CropPlan* plan) {
  const int oh = cfg.out_height, ow = cfg.out_width;
  Rect& win = plan->window;
  if (cfg.random_resized_crop) {
    const double area = static_cast<double>(in_height) * in_width;
    const double log_lo = std::log(cfg.min_aspect_ratio), log_hi = std::log(cfg.max_aspect_ratio);
    bool found = false;
    for (int attempt = 0; attempt < 10 && !found; ++attempt) {
      double target = rng->Uniform(cfg.min_random_area, cfg.max_random_area) * area;
      double ratio = std::exp(rng->Uniform(log_lo, log_hi));
      int w = static_cast<int>(std::lround(std::sqrt(target * ratio)));
      int h = static_cast<int>(std::lround(std::sqrt(target / ratio)));
      if (w > 0 && h > 0 && w <= in_width && h <= in_height) {
        win = Rect{rng->UniformInt(0, in_width - w), rng->UniformInt(0, in_height - h), w, h};
        found = true;
      }
    }
    if (!found) {  // the largest centred window whose aspect ratio is in range
      double in_ratio = static_cast<double>(in_width) / in_height;
      int w = in_width, h = in_height;
      if (in_ratio < cfg.min_aspect_ratio) {
        h = std::max(1, static_cast<int>(std::lround(w / cfg.min_aspect_ratio)));
      } else if (in_ratio > cfg.max_aspect_ratio) {
        w = std::max(1, static_cast<int>(std::lround(h * cfg.max_aspect_ratio)));
      }
      win = Rect{(in_width - w) / 2, (in_height - h) / 2, w, h};
    }
  } else {
    if (in_height < oh || in_width < ow) {
      return Status::InvalidArgument(StrCat(where, ": image of ", in_width, "x", in_height,
                                            " (after resize ", cfg.resize, " and pad ", cfg.pad,
                                            ") is smaller than the ", ow, "x", oh, " crop"));
    }
    if (cfg.rand_crop) {
      win = Rect{rng->UniformInt(0, in_width - ow), rng->UniformInt(0, in_height - oh), ow, oh};
    } else {
      win = Rect{(in_width - ow) / 2, (in_height - oh) / 2, ow, oh};
    }
  }
  plan->mirror = cfg.rand_mirror && (rng->Next() >> 63) != 0;
  return Status::Ok();
}

namespace {

// k[c] = scale / std[c], b[c] = -mean[c] * k[c]: out = pixel * k + b.
struct Affine {
  float k[3];
  float b[3];
};

Affine MakeAffine(const AugmentConfig& cfg) {
  Affine a;
  for (int c = 0; c < 3; ++c) {
    a.k[c] = cfg.scale / cfg.std_rgb[c];
    a.b[c] = cfg.mean_image.empty() ? -cfg.mean_rgb[c] * a.k[c] : 0.0f;
  }
  return a;
}

}  // namespace

void WriteNormalized(const AugmentConfig& cfg, const Image& src, Rect window, bool mirror,
                     float* out) {
  const int C = cfg.channels, oh = cfg.out_height, ow = cfg.out_width;
  CHECK_EQ(src.channels, C);
  CHECK(window.x >= 0 && window.y >= 0 && window.x + window.width <= src.width &&
        window.y + window.height <= src.height);
  const size_t plane = static_cast<size_t>(oh) * ow;
  const Affine af = MakeAffine(cfg);

  if (window.width == ow && window.height == oh) {
    for (int y = 0; y < oh; ++y) {
      const uint8_t* row = src.row(window.y + y) + static_cast<size_t>(window.x) * C;
      for (int c = 0; c < C; ++c) {
        float* dst = out + c * plane + static_cast<size_t>(y) * ow;
        const uint8_t* p = row + c;
        const float k = af.k[c], b = af.b[c];
        if (mirror) {
          for (int x = 0; x < ow; ++x) dst[x] = p[(ow - 1 - x) * C] * k + b;
        } else {
          for (int x = 0; x < ow; ++x) dst[x] = p[x * C] * k + b;
        }
      }
    }
  } else {
    // Separable bilinear (OpenCV's INTER_LINEAR rule): each source row of the
    // window is resized horizontally once, into planar floats (mirror folded
    // in), and output rows blend two such rows.
    std::vector<int> xa(ow), xb(ow);
    std::vector<float> wx(ow);
    const float sx = static_cast<float>(window.width) / ow;
    for (int x = 0; x < ow; ++x) {
      const int ox = mirror ? ow - 1 - x : x;
      float f = (ox + 0.5f) * sx - 0.5f;
      int i = static_cast<int>(std::floor(f));
      float a = f - i;
      if (i < 0) i = 0, a = 0;
      if (i >= window.width - 1) i = window.width - 1, a = 0;
      xa[x] = (window.x + i) * C;
      xb[x] = (window.x + std::min(i + 1, window.width - 1)) * C;
      wx[x] = a;
    }
    const size_t hrow = static_cast<size_t>(C) * ow;
    std::vector<float> hbuf(2 * hrow);
    int tag[2] = {-1, -1};
    auto horizontal = [&](int r, int avoid_slot) -> const float* {
      for (int s = 0; s < 2; ++s) {
        if (tag[s] == r) return hbuf.data() + s * hrow;
      }
      const int s = avoid_slot == 0 ? 1 : 0;
      tag[s] = r;
      float* h = hbuf.data() + s * hrow;
      const uint8_t* p = src.row(window.y + r);
      for (int c = 0; c < C; ++c) {
        float* hc = h + static_cast<size_t>(c) * ow;
        for (int x = 0; x < ow; ++x) {
          const float v0 = p[xa[x] + c], v1 = p[xb[x] + c];
          hc[x] = v0 + wx[x] * (v1 - v0);
        }
      }
      return h;
    };
    const float sy = static_cast<float>(window.height) / oh;
    for (int y = 0; y < oh; ++y) {
      float f = (y + 0.5f) * sy - 0.5f;
      int i = static_cast<int>(std::floor(f));
      float b = f - i;
      if (i < 0) i = 0, b = 0;
      if (i >= window.height - 1) i = window.height - 1, b = 0;
      const float* h0 = horizontal(i, -1);
      const int slot0 = h0 == hbuf.data() ? 0 : 1;
      const float* h1 = b == 0.0f ? h0 : horizontal(std::min(i + 1, window.height - 1), slot0);
      for (int c = 0; c < C; ++c) {
        const float* r0 = h0 + static_cast<size_t>(c) * ow;
        const float* r1 = h1 + static_cast<size_t>(c) * ow;
        float* dst = out + c * plane + static_cast<size_t>(y) * ow;
        const float k = af.k[c], bias = af.b[c];
        for (int x = 0; x < ow; ++x) dst[x] = (r0[x] + b * (r1[x] - r0[x])) * k + bias;
      }
    }
  }
  if (!cfg.mean_image.empty()) {
    // The mean is the crop's, subtracted before the flip (MXNet's order): a
    // mirrored output column x came from column ow-1-x and takes its mean.
    for (int c = 0; c < C; ++c) {
      const float k = af.k[c];
      for (int y = 0; y < oh; ++y) {
        const size_t row = c * plane + static_cast<size_t>(y) * ow;
        const float* m = cfg.mean_image.data() + row;
        float* o = out + row;
        if (mirror) {
          for (int x = 0; x < ow; ++x) o[x] -= m[ow - 1 - x] * k;
        } else {
          for (int x = 0; x < ow; ++x) o[x] -= m[x] * k;
        }
      }
    }
  }
}

Status AugmentImage(const AugmentConfig& cfg, std::string_view encoded, std::string_view where,
                    Rng* rng, AugmentScratch* scratch, float* out) {
  int h = 0, w = 0;
  RETURN_IF_ERROR(scratch->decoder.ReadSize(encoded, where, &h, &w));
  if (h <= 0 || w <= 0) {
    return Status::Corruption(StrCat(where, ": image has size ", w, "x", h));
  }
  CropPlan plan;
  double scale = 1.0;
  if (cfg.resize <= 0 && cfg.pad == 0) {
    // Decode just the window, at a reduced DCT scale when it is much larger
    // than the output.
    RETURN_IF_ERROR(PlanCrop(cfg, h, w, rng, where, &plan));
    RETURN_IF_ERROR(scratch->decoder.DecodeRegion(encoded, where, cfg.channels, plan.window,
                                                  cfg.out_height, cfg.out_width, &scratch->decoded,
                                                  &scale));
    const Image& d = scratch->decoded;
    WriteNormalized(cfg, d, Rect{0, 0, d.width, d.height}, plan.mirror, out);
    return Status::Ok();
  }
  Image* img = &scratch->decoded;
  if (cfg.resize > 0) {
    int nh = 0, nw = 0;
    RETURN_IF_ERROR(ShorterSideTo(h, w, cfg.resize, where, &nh, &nw));
    RETURN_IF_ERROR(scratch->decoder.DecodeRegion(encoded, where, cfg.channels, Rect{0, 0, w, h},
                                                  nh, nw, img, &scale));
    if (img->height != nh || img->width != nw) {
      ResizeBilinear(*img, nh, nw, &scratch->work);
      std::swap(scratch->decoded, scratch->work);
    }
  } else {
    RETURN_IF_ERROR(scratch->decoder.Decode(encoded, where, cfg.channels, img));
  }
  if (cfg.pad > 0) {
    const int p = cfg.pad, C = cfg.channels;
    Image& padded = scratch->work;
    padded.Resize(img->height + 2 * p, img->width + 2 * p, C);
    std::fill(padded.pixels.begin(), padded.pixels.end(), static_cast<uint8_t>(cfg.fill_value));
    for (int y = 0; y < img->height; ++y) {
      std::memcpy(padded.row(y + p) + static_cast<size_t>(p) * C, img->row(y),
                  static_cast<size_t>(img->width) * C);
    }
    std::swap(scratch->decoded, scratch->work);
  }
  RETURN_IF_ERROR(PlanCrop(cfg, img->height, img->width, rng, where, &plan));
  WriteNormalized(cfg, *img, plan.window, plan.mirror, out);
  return Status::Ok();
}

}  // namespace pstrain
