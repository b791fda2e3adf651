// JPEG/PNG codec, crop planning and the augmenter's output properties.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

// clang-format off
#include <cstdio>
#include <jpeglib.h>
// clang-format on
#include <png.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "data/augment.h"
#include "data/image_codec.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// A smooth RGB test pattern (JPEG keeps it to within a few levels).
Image Pattern(int h, int w) {
  Image img;
  img.Resize(h, w, 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = img.row(y) + x * 3;
      p[0] = static_cast<uint8_t>(40 + 160 * x / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>(40 + 160 * y / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>(128 + 60 * std::sin(0.05 * (x + y)));
    }
  }
  return img;
}

// An image whose every pixel value is distinct enough to check exact indexing.
Image Ramp(int h, int w) {
  Image img;
  img.Resize(h, w, 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) img.row(y)[x * 3 + c] = static_cast<uint8_t>(x + 16 * y + c);
    }
  }
  return img;
}

std::string Jpeg(const Image& img, int quality = 95) {
  std::string out;
  CHECK_OK(EncodeJpeg(img, quality, &out));
  return out;
}

AugmentConfig Config(int h, int w) {
  AugmentConfig cfg;
  cfg.out_height = h;
  cfg.out_width = w;
  return cfg;
}

TEST(ImageCodecTest, JpegRoundTripIsClose) {
  Image src = Pattern(48, 64);
  ImageDecoder dec;
  Image out;
  ASSERT_OK(dec.Decode(Jpeg(src), "mem", 3, &out));
  ASSERT_EQ(out.height, 48);
  ASSERT_EQ(out.width, 64);
  ASSERT_EQ(out.channels, 3);
  int max_diff = 0;
  for (size_t i = 0; i < src.pixels.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(int{src.pixels[i]} - int{out.pixels[i]}));
  }
  EXPECT_LE(max_diff, 12);
  Image gray;
  ASSERT_OK(dec.Decode(Jpeg(src), "mem", 1, &gray));
  EXPECT_EQ(gray.channels, 1);
}

TEST(ImageCodecTest, PngDecodesExactly) {
  Image src = Ramp(9, 11);
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = 11;
  img.height = 9;
  img.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  ASSERT_TRUE(png_image_write_get_memory_size(img, size, 0, src.pixels.data(), 0, nullptr));
  std::string png(size, '\0');
  ASSERT_TRUE(png_image_write_to_memory(&img, png.data(), &size, 0, src.pixels.data(), 0, nullptr));
  png.resize(size);
  EXPECT_EQ(DetectImageFormat(png), ImageFormat::kPng);
  ImageDecoder dec;
  Image out;
  ASSERT_OK(dec.Decode(png, "mem", 3, &out));
  EXPECT_EQ(out.pixels, src.pixels);
  double scale = 0;
  ASSERT_OK(dec.DecodeRegion(png, "mem", 3, Rect{2, 3, 5, 4}, 4, 5, &out, &scale));
  ASSERT_EQ(out.width, 5);
  EXPECT_EQ(out.row(1)[0], src.row(4)[6]);
}

// A PNG written with libpng's low-level API: `samples` holds height rows of
// width pixels of the colour type's samples, each `bit_depth` (8 or 16, big
// endian) bits; a palette (color type 3) comes with `palette` and `alpha`.
std::string WritePng(int width, int height, int bit_depth, int color_type, bool interlaced,
                     const std::vector<uint8_t>& samples,
                     const std::vector<png_color>& palette = {},
                     const std::vector<png_byte>& alpha = {}) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  std::string out;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    ADD_FAILURE() << "libpng could not write the test image";
    return "";
  }
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, png_size_t n) {
        static_cast<std::string*>(png_get_io_ptr(p))->append(reinterpret_cast<char*>(data), n);
      },
      nullptr);
  png_set_IHDR(png, info, width, height, bit_depth, color_type,
               interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (!alpha.empty()) {
    png_set_tRNS(png, info, alpha.data(), static_cast<int>(alpha.size()), nullptr);
  }
  png_write_info(png, info);
  const size_t row_bytes = samples.size() / height;
  std::vector<png_bytep> rows(height);
  for (int y = 0; y < height; ++y) rows[y] = const_cast<uint8_t*>(samples.data()) + y * row_bytes;
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// Found by a review: PNGs went through libpng's simplified API, which
// composes alpha over black, converts colour to gray in linear light and
// treats 16-bit samples as linear: not what MXNet's cv::imdecode gives.
TEST(ImageCodecTest, PngDecodesAsOpenCvDoes) {
  ImageDecoder dec;
  Image out;
  // RGBA, transparent and half transparent: the alpha is dropped.
  const std::string rgba =
      WritePng(2, 1, 8, PNG_COLOR_TYPE_RGBA, false, {200, 100, 50, 0, 200, 100, 50, 128});
  ASSERT_OK(dec.Decode(rgba, "rgba.png", 3, &out));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{200, 100, 50, 200, 100, 50}));
  // Colour to gray by 0.299/0.587/0.114 on the stored values (libpng's 15-bit
  // fixed-point weights, truncated: pure green is 149, not 150).
  const std::string rgb =
      WritePng(4, 1, 8, PNG_COLOR_TYPE_RGB, false, {255, 0, 0, 0, 255, 0, 0, 0, 255, 90, 90, 90});
  ASSERT_OK(dec.Decode(rgb, "rgb.png", 1, &out));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{76, 149, 29, 90}));
  // 16 bits: the high byte, no gamma.
  const std::string gray16 =
      WritePng(2, 1, 16, PNG_COLOR_TYPE_GRAY, false, {0x40, 0x00, 0xff, 0xff});
  ASSERT_OK(dec.Decode(gray16, "gray16.png", 1, &out));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{64, 255}));
  ASSERT_OK(dec.Decode(gray16, "gray16.png", 3, &out));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{64, 64, 64, 255, 255, 255}));
  // A palette with a transparent entry: its colour, alpha dropped.
  const std::string pal =
      WritePng(2, 1, 8, PNG_COLOR_TYPE_PALETTE, false, {0, 1}, {{10, 20, 30}, {40, 50, 60}}, {0});
  ASSERT_OK(dec.Decode(pal, "pal.png", 3, &out));
  EXPECT_EQ(out.pixels, (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
}

TEST(ImageCodecTest, PngRegionsOfInterlacedAndPlainImagesMatchTheWholeImage) {
  const Image src = Ramp(13, 17);
  ImageDecoder dec;
  for (bool interlaced : {false, true}) {
    const std::string png = WritePng(17, 13, 8, PNG_COLOR_TYPE_RGB, interlaced, src.pixels);
    Image whole, part;
    ASSERT_OK(dec.Decode(png, "mem", 3, &whole));
    EXPECT_EQ(whole.pixels, src.pixels) << interlaced;
    const Rect r{3, 5, 9, 6};
    double scale = 0;
    ASSERT_OK(dec.DecodeRegion(png, "mem", 3, r, r.height, r.width, &part, &scale));
    ASSERT_EQ(part.height, r.height);
    ASSERT_EQ(part.width, r.width);
    for (int y = 0; y < r.height; ++y) {
      EXPECT_EQ(0, std::memcmp(part.row(y), src.row(r.y + y) + r.x * 3, r.width * 3)) << y;
    }
    Status s = dec.DecodeRegion(png, "x.rec:7", 3, Rect{10, 0, 8, 2}, 2, 8, &part, &scale);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr("x.rec:7: region 8x2+10+0 outside the 17x13 image"));
  }
}

// Found by a review: a PNG of a few dozen bytes whose header claims 16384 x
// 16384 had its 805 MB allocated (twice for a region) before the data ran out.
TEST(ImageCodecTest, APngHeaderClaimingMoreThanItsBytesCanHoldIsRefused) {
  std::string png = WritePng(4, 4, 8, PNG_COLOR_TYPE_RGB, false, std::vector<uint8_t>(48, 7));
  // IHDR: its data at byte 16 (width, height), its CRC over type and data.
  auto be32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) png[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  be32(16, 16384);
  be32(20, 16384);
  be32(29, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(png.data() + 12), 17)));
  ImageDecoder dec;
  Image out;
  Status s = dec.Decode(png, "big.rec:64", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_THAT(s.message(), HasSubstr("big.rec:64: PNG header says 16384x16384"));
  EXPECT_THAT(s.message(), HasSubstr(StrCat("more than its ", png.size(), " bytes can hold")));
  EXPECT_TRUE(out.pixels.empty());
  // Cut short: an error naming the place, not a crash.
  const std::string good =
      WritePng(4, 4, 8, PNG_COLOR_TYPE_RGB, false, std::vector<uint8_t>(48, 7));
  s = dec.Decode(good.substr(0, good.size() - 20), "cut.png", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_THAT(s.message(), HasSubstr("cut.png: PNG"));
}

TEST(ImageCodecTest, RegionDecodeMatchesFullDecode) {
  const std::string jpeg = Jpeg(Pattern(100, 120));
  ImageDecoder dec;
  Image full, region;
  ASSERT_OK(dec.Decode(jpeg, "mem", 3, &full));
  const Rect r{37, 21, 50, 44};
  double scale = 0;
  ASSERT_OK(dec.DecodeRegion(jpeg, "mem", 3, r, r.height, r.width, &region, &scale));
  EXPECT_EQ(scale, 1.0);
  ASSERT_EQ(region.height, r.height);
  ASSERT_EQ(region.width, r.width);
  int max_diff = 0;
  for (int y = 0; y < r.height; ++y) {
    for (int x = 0; x < r.width * 3; ++x) {
      int a = region.row(y)[x], b = full.row(r.y + y)[r.x * 3 + x];
      max_diff = std::max(max_diff, std::abs(a - b));
    }
  }
  EXPECT_LE(max_diff, 2);  // libjpeg-turbo may upsample chroma differently at crop edges
}

TEST(ImageCodecTest, ScaledDecodeKeepsAtLeastTheOutputSize) {
  const std::string jpeg = Jpeg(Pattern(256, 320));
  ImageDecoder dec;
  Image out;
  double scale = 0;
  ASSERT_OK(dec.DecodeRegion(jpeg, "mem", 3, Rect{0, 0, 320, 256}, 60, 70, &out, &scale));
  EXPECT_EQ(scale, 2.0 / 8.0);  // 1/8 would give 32x40 < 60x70
  EXPECT_EQ(out.height, 64);
  EXPECT_EQ(out.width, 80);
}

TEST(ImageCodecTest, CmykJpegsDecodeToRgb) {
  // An Adobe-style (inverted) CMYK JPEG of one colour: C=255-200, M=255-100,
  // Y=255-50 stored inverted as 200/100/50 with K stored as 255 (no black).
  const int h = 16, w = 16;
  std::vector<uint8_t> cmyk(h * w * 4);
  for (int i = 0; i < h * w; ++i) {
    cmyk[i * 4] = 200;
    cmyk[i * 4 + 1] = 100;
    cmyk[i * 4 + 2] = 50;
    cmyk[i * 4 + 3] = 255;
  }
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;  // NOLINT: libjpeg's type
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = 4;
  c.in_color_space = JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 95, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = cmyk.data() + c.next_scanline * w * 4;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  std::string jpeg(reinterpret_cast<char*>(buf), size);
  jpeg_destroy_compress(&c);
  std::free(buf);

  ImageDecoder dec;
  Image out;
  ASSERT_OK(dec.Decode(jpeg, "cmyk.jpg", 3, &out));
  ASSERT_EQ(out.channels, 3);
  EXPECT_NEAR(out.row(8)[24], 200, 3);
  EXPECT_NEAR(out.row(8)[25], 100, 3);
  EXPECT_NEAR(out.row(8)[26], 50, 3);
  double scale = 0;
  ASSERT_OK(dec.DecodeRegion(jpeg, "cmyk.jpg", 1, Rect{4, 4, 8, 8}, 8, 8, &out, &scale));
  EXPECT_EQ(out.width, 8);
  EXPECT_NEAR(out.row(2)[2], (200 * 299 + 100 * 587 + 50 * 114) / 1000, 3);
}

TEST(ImageCodecTest, NotAnImageIsCorruptionNamingTheSource) {
  ImageDecoder dec;
  Image out;
  Status s = dec.Decode("GIF89a not a jpeg", "data.rec:4096", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("data.rec:4096"));
  EXPECT_THAT(s.message(), HasSubstr("not a JPEG"));
}

TEST(ImageCodecTest, HugeDeclaredSizesAreRefusedNotAllocated) {
  // A PNG header announcing 100000 x 100000 pixels.
  std::string png = "\x89PNG\r\n\x1a\n";
  png += std::string("\0\0\0\x0dIHDR", 8);
  png += std::string("\x00\x01\x86\xa0\x00\x01\x86\xa0\x08\x02\0\0\0", 13);
  png += std::string(4, '\0');
  ImageDecoder dec;
  int h = 0, w = 0;
  Status s = dec.ReadSize(png, "big.rec:8", &h, &w);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("big.rec:8"));
  Image out;
  EXPECT_FALSE(dec.Decode(png, "big.rec:8", 3, &out).ok());
}

// Found by tests/fuzz/fuzz_image: sides of 2^32 - 1 overflowed the pixel
// count (to a negative number that passed the check).
TEST(ImageCodecTest, SidesWhoseProductOverflowsAreRefused) {
  std::string png = "\x89PNG\r\n\x1a\n";
  png += std::string("\0\0\0\x0dIHDR", 8);
  png += std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x08\x02\0\0\0", 13);
  png += std::string(4, '\0');
  ImageDecoder dec;
  int h = 0, w = 0;
  Status s = dec.ReadSize(png, "odd.png", &h, &w);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("odd.png: image size 4294967295x4294967295"));
  Image out;
  EXPECT_EQ(dec.Decode(png, "odd.png", 3, &out).code(), StatusCode::kCorruption);
}

TEST(ImageCodecTest, TruncatedAndGarbledJpegsAreCorruption) {
  const std::string jpeg = Jpeg(Pattern(64, 64));
  ImageDecoder dec;
  Image out;
  Status s = dec.Decode(jpeg.substr(0, jpeg.size() / 2), "t.rec:8", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("t.rec:8"));
  s = dec.Decode(jpeg.substr(0, 20), "t.rec:16", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  std::string garbled = jpeg;
  for (size_t i = 2; i < 200 && i < garbled.size(); ++i) garbled[i] = static_cast<char>(0x5A);
  s = dec.Decode(garbled, "t.rec:24", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  // The decoder is still usable afterwards.
  ASSERT_OK(dec.Decode(jpeg, "t.rec:32", 3, &out));
  EXPECT_EQ(out.width, 64);
}

// Found by review: a JPEG of a few hundred bytes whose frame header claims
// 16384x16384 made the decoder allocate 768 MiB and decode every row from
// made-up data before reporting the truncation. It is refused from its
// header, and a truncated one stops where its data ends.
TEST(ImageCodecTest, AJpegTooSmallForTheSizeItClaimsIsRefusedFromItsHeader) {
  std::string forged = Jpeg(Pattern(64, 64));
  const size_t sof = forged.find("\xff\xc0");
  ASSERT_NE(sof, std::string::npos);
  for (size_t at : {sof + 5, sof + 7}) {  // height, width: 0x4000 = 16384
    forged[at] = 0x40;
    forged[at + 1] = 0;
  }
  ImageDecoder dec;
  Image out;
  Status s = dec.Decode(forged, "f.rec:0", 3, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("cannot hold a 16384x16384 image (it needs at least 32768"));
  EXPECT_LT(out.pixels.size(), size_t{1} << 20) << "allocated for the claimed size";
  // A truncated JPEG is said to be one.
  const std::string jpeg = Jpeg(Pattern(64, 64));
  s = dec.Decode(jpeg.substr(0, jpeg.size() / 2), "t.rec:8", 3, &out);
  EXPECT_THAT(s.message(), HasSubstr("t.rec:8: truncated JPEG"));
  // A plain image compresses far below any real image and still decodes.
  Image flat;
  flat.Resize(1024, 1024, 3);
  std::fill(flat.pixels.begin(), flat.pixels.end(), 200);
  const std::string small = Jpeg(flat, 75);
  ASSERT_OK(dec.Decode(small, "flat", 3, &out));
  EXPECT_EQ(out.width, 1024);
}

TEST(AugmentTest, CenterCropTakesTheMiddle) {
  Image src = Ramp(10, 12);
  AugmentConfig cfg = Config(6, 8);
  Rng rng(1);
  CropPlan plan;
  ASSERT_OK(PlanCrop(cfg, src.height, src.width, &rng, "x", &plan));
  EXPECT_EQ(plan.window.x, 2);
  EXPECT_EQ(plan.window.y, 2);
  EXPECT_FALSE(plan.mirror);
  std::vector<float> out(3 * 6 * 8);
  WriteNormalized(cfg, src, plan.window, plan.mirror, out.data());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 6; ++y) {
      for (int x = 0; x < 8; ++x) {
        ASSERT_EQ(out[(c * 6 + y) * 8 + x], src.row(y + 2)[(x + 2) * 3 + c]);
      }
    }
  }
}

TEST(AugmentTest, RandomCropStaysInBoundsAndReachesTheEdges) {
  AugmentConfig cfg = Config(28, 28);
  cfg.rand_crop = true;
  int min_x = 100, max_x = -1, min_y = 100, max_y = -1;
  for (uint64_t seed = 0; seed < 500; ++seed) {
    Rng rng(seed);
    CropPlan plan;
    ASSERT_OK(PlanCrop(cfg, 32, 36, &rng, "x", &plan));
    ASSERT_EQ(plan.window.width, 28);
    ASSERT_EQ(plan.window.height, 28);
    min_x = std::min(min_x, plan.window.x);
    max_x = std::max(max_x, plan.window.x);
    min_y = std::min(min_y, plan.window.y);
    max_y = std::max(max_y, plan.window.y);
  }
  EXPECT_EQ(min_x, 0);
  EXPECT_EQ(max_x, 8);
  EXPECT_EQ(min_y, 0);
  EXPECT_EQ(max_y, 4);
}

TEST(AugmentTest, MirrorFlipsRowsAndHappensAboutHalfTheTime) {
  Image src = Ramp(8, 9);
  AugmentConfig cfg = Config(8, 9);
  std::vector<float> plain(3 * 8 * 9), flipped(3 * 8 * 9);
  WriteNormalized(cfg, src, Rect{0, 0, 9, 8}, false, plain.data());
  WriteNormalized(cfg, src, Rect{0, 0, 9, 8}, true, flipped.data());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 8; ++y) {
      for (int x = 0; x < 9; ++x) {
        ASSERT_EQ(flipped[(c * 8 + y) * 9 + x], plain[(c * 8 + y) * 9 + (8 - x)]);
      }
    }
  }
  cfg.rand_mirror = true;
  int mirrored = 0;
  for (uint64_t seed = 0; seed < 1000; ++seed) {
    Rng rng(seed);
    CropPlan plan;
    ASSERT_OK(PlanCrop(cfg, 8, 9, &rng, "x", &plan));
    mirrored += plan.mirror;
  }
  EXPECT_GT(mirrored, 420);
  EXPECT_LT(mirrored, 580);
}

TEST(AugmentTest, NormalizationUsesMeanStdAndScale) {
  Image src = Ramp(4, 4);
  AugmentConfig cfg = Config(4, 4);
  cfg.mean_rgb[0] = 10;
  cfg.mean_rgb[1] = 20;
  cfg.mean_rgb[2] = 30;
  cfg.std_rgb[0] = 2;
  cfg.std_rgb[1] = 4;
  cfg.std_rgb[2] = 8;
  cfg.scale = 0.5f;
  std::vector<float> out(3 * 16);
  WriteNormalized(cfg, src, Rect{0, 0, 4, 4}, false, out.data());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 16; ++i) {
      float p = src.row(i / 4)[(i % 4) * 3 + c];
      EXPECT_FLOAT_EQ(out[c * 16 + i], (p - cfg.mean_rgb[c]) / cfg.std_rgb[c] * 0.5f);
    }
  }
  cfg.mean_image.assign(3 * 16, 0.0f);
  for (size_t i = 0; i < cfg.mean_image.size(); ++i) cfg.mean_image[i] = static_cast<float>(i);
  ASSERT_OK(cfg.Validate());
  WriteNormalized(cfg, src, Rect{0, 0, 4, 4}, false, out.data());
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 16; ++i) {
      float p = src.row(i / 4)[(i % 4) * 3 + c];
      EXPECT_FLOAT_EQ(out[c * 16 + i], (p - (c * 16 + i)) / cfg.std_rgb[c] * 0.5f);
    }
  }
}

// MXNet subtracts the mean image from the crop and then mirrors it
// (iter_normalize.h, iter_image_recordio_2.cc): a flipped pixel keeps the mean
// of the place it came from. Found by review: the mean was subtracted in the
// output's places, so half the training images carried a mirrored bias.
TEST(AugmentTest, TheMeanImageIsSubtractedBeforeTheMirror) {
  AugmentConfig cfg = Config(1, 4);
  cfg.channels = 1;
  cfg.mean_image = {0, 10, 20, 30};
  ASSERT_OK(cfg.Validate());
  Image src;
  src.Resize(1, 4, 1);
  for (int x = 0; x < 4; ++x) src.pixels[x] = static_cast<uint8_t>(100 + x);
  float out[4];
  WriteNormalized(cfg, src, Rect{0, 0, 4, 1}, true, out);
  EXPECT_THAT(out, ::testing::ElementsAre(73, 82, 91, 100));
  WriteNormalized(cfg, src, Rect{0, 0, 4, 1}, false, out);
  EXPECT_THAT(out, ::testing::ElementsAre(100, 91, 82, 73));

  // The resizing path (a window of another size than the output) flips the
  // same way: a mirrored output is the unmirrored one reversed, mean and all.
  Image big = Ramp(6, 8);
  AugmentConfig rgb = Config(3, 4);
  rgb.mean_image.resize(3 * 12);
  for (size_t i = 0; i < rgb.mean_image.size(); ++i) rgb.mean_image[i] = 3.0f * i;
  ASSERT_OK(rgb.Validate());
  std::vector<float> plain(3 * 12), flipped(3 * 12);
  WriteNormalized(rgb, big, Rect{1, 0, 7, 6}, false, plain.data());
  WriteNormalized(rgb, big, Rect{1, 0, 7, 6}, true, flipped.data());
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 3; ++y) {
      for (int x = 0; x < 4; ++x) {
        EXPECT_FLOAT_EQ(flipped[c * 12 + y * 4 + x], plain[c * 12 + y * 4 + 3 - x])
            << "c " << c << " y " << y << " x " << x;
      }
    }
  }
}

TEST(AugmentTest, RandomResizedCropRespectsAreaAndAspectRanges) {
  AugmentConfig cfg = Config(32, 32);
  cfg.random_resized_crop = true;
  cfg.min_random_area = 0.08f;
  cfg.max_random_area = 1.0f;
  cfg.min_aspect_ratio = 3.0f / 4.0f;
  cfg.max_aspect_ratio = 4.0f / 3.0f;
  ASSERT_OK(cfg.Validate());
  const int H = 200, W = 300;
  double min_area = 1, max_area = 0;
  for (uint64_t seed = 0; seed < 2000; ++seed) {
    Rng rng(seed);
    CropPlan plan;
    ASSERT_OK(PlanCrop(cfg, H, W, &rng, "x", &plan));
    const Rect& r = plan.window;
    ASSERT_GE(r.x, 0);
    ASSERT_GE(r.y, 0);
    ASSERT_LE(r.x + r.width, W);
    ASSERT_LE(r.y + r.height, H);
    double area = static_cast<double>(r.width) * r.height / (H * W);
    double aspect = static_cast<double>(r.width) / r.height;
    min_area = std::min(min_area, area);
    max_area = std::max(max_area, area);
    // Rounding to whole pixels moves both a little.
    EXPECT_GE(area, 0.075);
    EXPECT_LE(area, 1.0);
    EXPECT_GE(aspect, 0.75 * 0.95);
    EXPECT_LE(aspect, 4.0 / 3.0 * 1.05);
  }
  EXPECT_LT(min_area, 0.12);
  EXPECT_GT(max_area, 0.6);
}

TEST(AugmentTest, RandomResizedCropFallsBackToACentredWindow) {
  AugmentConfig cfg = Config(16, 16);
  cfg.random_resized_crop = true;
  cfg.min_random_area = cfg.max_random_area = 1.0f;
  cfg.min_aspect_ratio = cfg.max_aspect_ratio = 1.0f;
  Rng rng(3);
  CropPlan plan;
  ASSERT_OK(PlanCrop(cfg, 40, 100, &rng, "x", &plan));  // a 1:1 window of full area never fits
  EXPECT_EQ(plan.window.width, 40);
  EXPECT_EQ(plan.window.height, 40);
  EXPECT_EQ(plan.window.x, 30);
  EXPECT_EQ(plan.window.y, 0);
}

TEST(AugmentTest, ImageSmallerThanTheCropIsAnError) {
  AugmentConfig cfg = Config(28, 28);
  cfg.rand_crop = true;
  AugmentScratch scratch;
  std::vector<float> out(3 * 28 * 28);
  Rng rng(0);
  Status s = AugmentImage(cfg, Jpeg(Pattern(20, 40)), "cifar.rec:1234", &rng, &scratch, out.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("cifar.rec:1234"));
  EXPECT_THAT(s.message(), HasSubstr("smaller than the 28x28 crop"));
}

TEST(AugmentTest, PadSurroundsTheImageWithTheFillValue) {
  AugmentConfig cfg = Config(40, 40);
  cfg.pad = 4;
  cfg.fill_value = 127;
  AugmentScratch scratch;
  std::vector<float> out(3 * 40 * 40);
  Rng rng(0);
  ASSERT_OK(AugmentImage(cfg, Jpeg(Pattern(32, 32)), "m", &rng, &scratch, out.data()));
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 40; ++i) {
      EXPECT_EQ(out[(c * 40 + 0) * 40 + i], 127.0f);
      EXPECT_EQ(out[(c * 40 + 39) * 40 + i], 127.0f);
      EXPECT_EQ(out[(c * 40 + i) * 40 + 3], 127.0f);
      EXPECT_EQ(out[(c * 40 + i) * 40 + 36], 127.0f);
    }
  }
  EXPECT_NE(out[(0 * 40 + 20) * 40 + 20], 127.0f);
}

TEST(AugmentTest, ResizeMakesTheShorterSideTheGivenLength) {
  AugmentConfig cfg = Config(20, 30);
  cfg.resize = 20;  // 40x80 -> 20x40, centre crop 20x30
  AugmentScratch scratch;
  std::vector<float> out(3 * 20 * 30);
  Rng rng(0);
  ASSERT_OK(AugmentImage(cfg, Jpeg(Pattern(40, 80)), "m", &rng, &scratch, out.data()));
  // Red grows left to right across the crop: 40 + 160 * x / 79 at full size.
  EXPECT_LT(out[0], out[29]);
  EXPECT_NEAR(out[15], 40 + 160.0 * 40 / 79, 6.0);
}

TEST(AugmentTest, SameSeedSameOutputAcrossScratchSpaces) {
  AugmentConfig cfg = Config(24, 24);
  cfg.random_resized_crop = true;
  cfg.min_random_area = 0.2f;
  cfg.min_aspect_ratio = 0.75f;
  cfg.max_aspect_ratio = 1.333f;
  cfg.rand_mirror = true;
  const std::string jpeg = Jpeg(Pattern(64, 80));
  AugmentScratch s1, s2;
  std::vector<float> a(3 * 24 * 24), b(a.size()), c(a.size());
  Rng r1(77), r2(77), r3(78);
  ASSERT_OK(AugmentImage(cfg, jpeg, "m", &r1, &s1, a.data()));
  ASSERT_OK(AugmentImage(cfg, jpeg, "m", &r2, &s2, b.data()));
  ASSERT_OK(AugmentImage(cfg, jpeg, "m", &r3, &s2, c.data()));
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(AugmentTest, ValidateRejectsBadRanges) {
  AugmentConfig cfg = Config(8, 8);
  cfg.random_resized_crop = true;
  cfg.min_random_area = 0.5f;
  cfg.max_random_area = 0.1f;
  EXPECT_EQ(cfg.Validate().code(), StatusCode::kInvalidArgument);
  cfg = Config(0, 8);
  EXPECT_EQ(cfg.Validate().code(), StatusCode::kInvalidArgument);
  cfg = Config(8, 8);
  cfg.std_rgb[1] = 0;
  EXPECT_EQ(cfg.Validate().code(), StatusCode::kInvalidArgument);
  // A pad that no image side can take (2 * pad overflowed an int at 2^30).
  cfg = Config(8, 8);
  cfg.pad = 32767;
  EXPECT_OK(cfg.Validate());
  for (int pad : {32768, 1 << 30}) {
    cfg.pad = pad;
    const Status s = cfg.Validate();
    EXPECT_NE(s.message().find(StrCat("pad size ", pad, " is over 32767")), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace pstrain
