// Image decoding (JPEG with libjpeg-turbo, PNG with libpng), JPEG and PNG encoding and
// bilinear resizing of 8-bit interleaved (HWC) images.
#ifndef PSTRAIN_DATA_IMAGE_CODEC_H_
#define PSTRAIN_DATA_IMAGE_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pstrain {

// An 8-bit image, rows of width*channels bytes, RGB or gray.
struct Image {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels

  void Resize(int h, int w, int c) {
    height = h;
    width = w;
    channels = c;
    pixels.resize(static_cast<size_t>(h) * w * c);
  }
  uint8_t* row(int y) { return pixels.data() + static_cast<size_t>(y) * width * channels; }
  const uint8_t* row(int y) const {
    return pixels.data() + static_cast<size_t>(y) * width * channels;
  }
};

enum class ImageFormat { kUnknown, kJpeg, kPng };
// By the leading signature bytes.
ImageFormat DetectImageFormat(std::string_view bytes);

// What an image's header says. `channels` is what the image decodes to in its
// own colour space: 1 for a gray JPEG or PNG (a PNG's alpha is dropped), 3 for
// everything else (colour, palette, CMYK JPEGs, which decode to RGB).
struct ImageInfo {
  ImageFormat format = ImageFormat::kUnknown;
  int height = 0;
  int width = 0;
  int channels = 0;
};

// A rectangle in pixel coordinates.
struct Rect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

// Decodes JPEG and PNG. Holds libjpeg's state between calls so that a stream of
// small images costs no allocation. Not thread-safe: one per thread.
// `where` ("file.rec:1234") names the source in error messages; bytes that are
// not a JPEG or PNG, or that fail to decode, are Corruption.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // Reads only the header: *height and *width of the full image.
  Status ReadSize(std::string_view bytes, std::string_view where, int* height, int* width);

  // Reads only the header: format, size and native channels (see ImageInfo).
  Status ReadInfo(std::string_view bytes, std::string_view where, ImageInfo* info);

  // Decodes the whole image into *out with `channels` (3: RGB, 1: gray), as
  // MXNet's cv::imdecode: a PNG's 16-bit samples keep their high byte, its
  // alpha is dropped (not composed), no gamma is applied to the samples, and
  // colour becomes gray by libpng's 0.299/0.587/0.114 weights (in linear light
  // for a file with a gAMA or sRGB chunk, as in OpenCV). A PNG whose header claims
  // more pixels than its bytes can hold (deflate packs at most ~1032:1) is
  // Corruption before anything is allocated.
  Status Decode(std::string_view bytes, std::string_view where, int channels, Image* out);

  // Decodes only `region` (full-resolution coordinates, inside the image) into
  // *out. For a JPEG the rows above and below are skipped, the columns outside
  // are cropped inside libjpeg-turbo, and the DCT is scaled by the smallest
  // s/8 (s = 1..8) that keeps the region at least min_width x min_height, so
  // *out may be smaller than the region (by the factor *scale, 1 when unscaled).
  // A PNG is decoded a row at a time, keeping the region's (an interlaced one
  // needs the whole image).
  Status DecodeRegion(std::string_view bytes, std::string_view where, int channels, Rect region,
                      int min_height, int min_width, Image* out, double* scale);

 private:
  struct Jpeg;
  std::unique_ptr<Jpeg> jpeg_;
  std::vector<uint8_t> row_;  // one scanline of a cropped decode
};

// Encodes an RGB or gray image as a baseline JPEG of `quality` (1..100).
Status EncodeJpeg(const Image& image, int quality, std::string* out);

// Encodes an RGB or gray image as PNG (lossless: decoding gives the pixels back).
Status EncodePng(const Image& image, std::string* out);

// The size of a height x width image scaled so that its shorter side is
// `shorter` (the longer side rounded down, as MXNet's im2rec and resize
// augmenter). Corruption naming `where` when the result is larger than an
// image may be (2^28 pixels, the bound decoding applies), so that an extreme
// aspect ratio is an error rather than an allocation of gigabytes.
Status ShorterSideTo(int height, int width, int shorter, std::string_view where, int* out_height,
                     int* out_width);

// Bilinear resize with pixel centres aligned (OpenCV's INTER_LINEAR rule).
// REQUIRES: src non-empty, out_height and out_width > 0.
void ResizeBilinear(const Image& src, int out_height, int out_width, Image* out);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IMAGE_CODEC_H_
