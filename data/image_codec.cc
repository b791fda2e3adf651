#include "data/image_codec.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <vector>

// jpeglib.h needs FILE and size_t declared before it; jerror.h comes after it.
// clang-format off
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <png.h>

namespace pstrain {
namespace {

// libjpeg reports errors by calling error_exit, which must not return: we
// longjmp back to the call that set `jump`. Code between setjmp and a possible
// longjmp creates no objects with destructors.
struct JpegError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;  // libjpeg warned that the data ended early
};

void JpegErrorExit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings about stray bytes are not fatal (as in OpenCV and PIL); data that
// ends before the image does is corruption, reported at once (libjpeg would
// go on decoding every row left from made-up data).
void JpegEmitMessage(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (level < 0) {
    ++err->pub.num_warnings;
    if (err->pub.msg_code == JWRN_JPEG_EOF) {
      err->truncated = true;
      (*cinfo->err->format_message)(cinfo, err->message);
      std::longjmp(err->jump, 1);
    }
  }
}

void InitJpegError(JpegError* err) {
  jpeg_std_error(&err->pub);
  err->pub.error_exit = JpegErrorExit;
  err->pub.emit_message = JpegEmitMessage;
  err->message[0] = '\0';
  err->truncated = false;
}

std::string FirstBytesHex(std::string_view bytes) {
  std::string out;
  char buf[4];
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i) {
    std::snprintf(buf, sizeof(buf), "%02x", static_cast<unsigned char>(bytes[i]));
    if (!out.empty()) out += ' ';
    out += buf;
  }
  return out.empty() ? "none" : out;
}

// Larger images are refused rather than allocated (a corrupt header could ask
// for many gigabytes): 2^28 pixels, e.g. 16384 x 16384.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

Status CheckSize(int64_t height, int64_t width, std::string_view where) {
  // Each side first: the product of two corrupt 32-bit sides overflows.
  if (height <= 0 || width <= 0 || height > kMaxPixels || width > kMaxPixels ||
      height * width > kMaxPixels) {
    return Status::Corruption(StrCat(where, ": image size ", width, "x", height,
                                     " is empty or larger than ", kMaxPixels, " pixels"));
  }
  return Status::Ok();
}

// A PNG in memory, read with libpng's low-level API. Errors longjmp back to
// the last setjmp on png_jmpbuf after copying libpng's message here.
struct PngRead {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const unsigned char* data = nullptr;
  size_t size = 0;
  size_t at = 0;
  char message[256] = "";
  ~PngRead() {
    if (png != nullptr) png_destroy_read_struct(&png, info != nullptr ? &info : nullptr, nullptr);
  }
};

void PngError(png_structp png, png_const_charp msg) {
  auto* r = static_cast<PngRead*>(png_get_error_ptr(png));
  std::snprintf(r->message, sizeof(r->message), "%s", msg);
  png_longjmp(png, 1);
}

void PngWarning(png_structp, png_const_charp) {}  // as OpenCV: not fatal, not shown

void PngReadBytes(png_structp png, png_bytep out, png_size_t n) {
  auto* r = static_cast<PngRead*>(png_get_io_ptr(png));
  if (n > r->size - r->at) png_error(png, "the data ends early (truncated)");
  std::memcpy(out, r->data + r->at, n);
  r->at += n;
}

// Deflate packs at most about 1032 bytes into one: pixel data (with PNG's
// filter bytes) larger than this many times the whole file is a corrupt or
// forged header, refused before anything is allocated for it.
constexpr uint64_t kMaxPngRatio = 1100;

// The steps of a PNG decode that call libpng, each under its own setjmp with
// no object with a destructor in its frame (a longjmp would skip it). False
// on a libpng error (r->message says which).
bool PngReadHeader(PngRead* r) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  png_read_info(r->png, r->info);
  return true;
}

// MXNet's cv::imdecode (OpenCV's PNG decoder, the same libpng calls): 16-bit
// samples cut to their high byte, alpha (and a palette's transparency)
// dropped, palettes and 1/2/4-bit gray expanded, no gamma correction of the
// samples, gray to RGB by copying, RGB to gray by libpng's 0.299/0.587/0.114
// weights (which libpng applies in linear light when the file has a gAMA or
// sRGB chunk, as it does for OpenCV). Returns the passes to read.
bool PngSetTransforms(PngRead* r, int channels, int* passes) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  const int bit_depth = png_get_bit_depth(r->png, r->info);
  const int color_type = png_get_color_type(r->png, r->info);
  if (bit_depth == 16) png_set_strip_16(r->png);
  png_set_strip_alpha(r->png);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(r->png);
  if ((color_type & PNG_COLOR_MASK_COLOR) == 0 && bit_depth < 8) {
    png_set_expand_gray_1_2_4_to_8(r->png);
  }
  if (channels == 3) {
    if ((color_type & PNG_COLOR_MASK_COLOR) == 0) png_set_gray_to_rgb(r->png);
  } else {
    png_set_rgb_to_gray(r->png, 1, 0.299, 0.587);
  }
  *passes = png_set_interlace_handling(r->png);
  png_read_update_info(r->png, r->info);
  return true;
}

// Reads every row and keeps `want` of them in *out. `rows` is empty (rows
// are read one at a time into `row`) or points at every row of the image (an
// interlaced one).
bool PngReadRows(PngRead* r, png_uint_32 height, const Rect& want, size_t skip, size_t keep,
                 png_bytep row, png_bytep* rows, Image* out) {
  if (setjmp(png_jmpbuf(r->png))) return false;
  if (rows != nullptr) {
    png_read_image(r->png, rows);
    for (int y = 0; y < want.height; ++y) std::memcpy(out->row(y), rows[want.y + y] + skip, keep);
  } else {
    for (png_uint_32 y = 0; y < height; ++y) {
      png_read_row(r->png, row, nullptr);
      const int64_t at = int64_t{y} - want.y;
      if (at >= 0 && at < want.height)
        std::memcpy(out->row(static_cast<int>(at)), row + skip, keep);
    }
  }
  png_read_end(r->png, nullptr);
  return true;
}

// Decodes the rows and columns of `region` (the whole image when null) of a
// PNG as MXNet does (PngSetTransforms). Rows are decoded one at a time, so a
// region costs its own size (an interlaced image needs all rows at once).
Status DecodePng(std::string_view bytes, std::string_view where, int channels, const Rect* region,
                 Image* out) {
  PngRead r;
  r.data = reinterpret_cast<const unsigned char*>(bytes.data());
  r.size = bytes.size();
  r.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &r, PngError, PngWarning);
  if (r.png != nullptr) r.info = png_create_info_struct(r.png);
  if (r.png == nullptr || r.info == nullptr) {
    return Status::ResourceExhausted(StrCat(where, ": cannot allocate libpng's state"));
  }
  png_set_read_fn(r.png, &r, PngReadBytes);
  if (!PngReadHeader(&r)) return Status::Corruption(StrCat(where, ": PNG header: ", r.message));
  const png_uint_32 width = png_get_image_width(r.png, r.info);
  const png_uint_32 height = png_get_image_height(r.png, r.info);
  RETURN_IF_ERROR(CheckSize(height, width, where));
  const uint64_t filtered = uint64_t{height} * (png_get_rowbytes(r.png, r.info) + 1);
  if (filtered > kMaxPngRatio * bytes.size()) {
    return Status::Corruption(StrCat(where, ": PNG header says ", width, "x", height, " (",
                                     filtered, " bytes of pixel data), more than its ",
                                     bytes.size(), " bytes can hold"));
  }
  int passes = 1;
  if (!PngSetTransforms(&r, channels, &passes)) {
    return Status::Corruption(StrCat(where, ": PNG header: ", r.message));
  }
  const size_t row_bytes = size_t{width} * channels;
  if (png_get_rowbytes(r.png, r.info) != row_bytes) {
    return Status::Corruption(StrCat(where, ": PNG rows decode to ",
                                     png_get_rowbytes(r.png, r.info), " bytes, expected ",
                                     row_bytes, " (", width, " pixels of ", channels, ")"));
  }
  const Rect want =
      region != nullptr ? *region : Rect{0, 0, static_cast<int>(width), static_cast<int>(height)};
  if (want.x < 0 || want.y < 0 || want.width <= 0 || want.height <= 0 ||
      int64_t{want.x} + want.width > width || int64_t{want.y} + want.height > height) {
    return Status::InvalidArgument(StrCat(where, ": region ", want.width, "x", want.height, "+",
                                          want.x, "+", want.y, " outside the ", width, "x", height,
                                          " image"));
  }
  out->Resize(want.height, want.width, channels);
  std::vector<uint8_t> pixels(passes > 1 ? row_bytes * height : row_bytes);
  std::vector<png_bytep> rows(passes > 1 ? height : 0);
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = pixels.data() + y * row_bytes;
  if (!PngReadRows(&r, height, want, static_cast<size_t>(want.x) * channels,
                   static_cast<size_t>(want.width) * channels, pixels.data(),
                   rows.empty() ? nullptr : rows.data(), out)) {
    return Status::Corruption(StrCat(where, ": PNG decode: ", r.message));
  }
  return Status::Ok();
}

Status CheckChannels(int channels, std::string_view where) {
  if (channels != 1 && channels != 3) {
    return Status::InvalidArgument(
        StrCat(where, ": images decode to 1 or 3 channels, not ", channels));
  }
  return Status::Ok();
}

}  // namespace

ImageFormat DetectImageFormat(std::string_view bytes) {
  if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
      static_cast<unsigned char>(bytes[1]) == 0xD8 &&
      static_cast<unsigned char>(bytes[2]) == 0xFF) {
    return ImageFormat::kJpeg;
  }
  static const unsigned char kPngSig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSig, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

struct ImageDecoder::Jpeg {
  jpeg_decompress_struct cinfo;
  JpegError err;
};

ImageDecoder::ImageDecoder() : jpeg_(new Jpeg) {
  InitJpegError(&jpeg_->err);
  jpeg_->cinfo.err = &jpeg_->err.pub;
  jpeg_create_decompress(&jpeg_->cinfo);
}

ImageDecoder::~ImageDecoder() { jpeg_destroy_decompress(&jpeg_->cinfo); }

Status ImageDecoder::ReadSize(std::string_view bytes, std::string_view where, int* height,
                              int* width) {
  ImageInfo info;
  RETURN_IF_ERROR(ReadInfo(bytes, where, &info));
  *height = info.height;
  *width = info.width;
  return Status::Ok();
}

Status ImageDecoder::ReadInfo(std::string_view bytes, std::string_view where, ImageInfo* info) {
  info->format = DetectImageFormat(bytes);
  if (info->format == ImageFormat::kPng) {
    // Signature (8), then the IHDR chunk: length, "IHDR", width, height, bit
    // depth, colour type (0 gray, 4 gray + alpha, 2/3/6 colour).
    if (bytes.size() < 26) return Status::Corruption(StrCat(where, ": truncated PNG header"));
    auto be32 = [&](size_t at) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data() + at);
      return int64_t{(uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) |
                     uint32_t{p[3]}};
    };
    RETURN_IF_ERROR(CheckSize(be32(20), be32(16), where));
    info->width = static_cast<int>(be32(16));
    info->height = static_cast<int>(be32(20));
    const unsigned char color_type = static_cast<unsigned char>(bytes[25]);
    info->channels = color_type == 0 || color_type == 4 ? 1 : 3;
    return Status::Ok();
  }
  if (info->format != ImageFormat::kJpeg) {
    return Status::Corruption(
        StrCat(where, ": not a JPEG or PNG image (first bytes ", FirstBytesHex(bytes), ")"));
  }
  jpeg_decompress_struct* cinfo = &jpeg_->cinfo;
  // A decode left midway (an allocation that threw) must not leave libjpeg in
  // a state that refuses every later image: start from idle (legal in any).
  jpeg_abort_decompress(cinfo);
  if (setjmp(jpeg_->err.jump)) {
    jpeg_abort_decompress(cinfo);
    return Status::Corruption(StrCat(where, ": JPEG header: ", jpeg_->err.message));
  }
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(cinfo, TRUE);
  info->height = static_cast<int>(cinfo->image_height);
  info->width = static_cast<int>(cinfo->image_width);
  info->channels = cinfo->jpeg_color_space == JCS_GRAYSCALE ? 1 : 3;
  jpeg_abort_decompress(cinfo);
  return CheckSize(info->height, info->width, where);
}

Status ImageDecoder::Decode(std::string_view bytes, std::string_view where, int channels,
                            Image* out) {
  int h = 0, w = 0;
  RETURN_IF_ERROR(ReadSize(bytes, where, &h, &w));
  double scale = 1.0;
  return DecodeRegion(bytes, where, channels, Rect{0, 0, w, h}, h, w, out, &scale);
}

Status ImageDecoder::DecodeRegion(std::string_view bytes, std::string_view where, int channels,
                                  Rect region, int min_height, int min_width, Image* out,
                                  double* scale) {
  RETURN_IF_ERROR(CheckChannels(channels, where));
  *scale = 1.0;
  ImageFormat fmt = DetectImageFormat(bytes);
  if (fmt == ImageFormat::kPng) return DecodePng(bytes, where, channels, &region, out);
  if (fmt != ImageFormat::kJpeg) {
    return Status::Corruption(
        StrCat(where, ": not a JPEG or PNG image (first bytes ", FirstBytesHex(bytes), ")"));
  }

  jpeg_decompress_struct* cinfo = &jpeg_->cinfo;
  jpeg_abort_decompress(cinfo);  // as in ReadInfo
  jpeg_->err.truncated = false;
  if (setjmp(jpeg_->err.jump)) {
    jpeg_abort_decompress(cinfo);
    if (jpeg_->err.truncated) {
      return Status::Corruption(
          StrCat(where, ": truncated JPEG (", bytes.size(), " bytes end inside the image data)"));
    }
    return Status::Corruption(StrCat(where, ": JPEG decode: ", jpeg_->err.message));
  }
  jpeg_mem_src(cinfo, reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size());
  jpeg_read_header(cinfo, TRUE);
  const int full_w = static_cast<int>(cinfo->image_width);
  const int full_h = static_cast<int>(cinfo->image_height);
  if (int64_t{full_w} * full_h > kMaxPixels) {
    jpeg_abort_decompress(cinfo);
    return CheckSize(full_h, full_w, where);
  }
  // Huffman-coded data spends at least a bit on every block of the first
  // scan, and no component is sampled below 1/4 of the full size: a file of
  // a few hundred bytes claiming 16384x16384 (768 MiB to allocate and fill
  // from made-up data) cannot be a whole image. (Arithmetic coding has no
  // such floor.)
  const int64_t min_blocks = ((int64_t{full_w} + 31) / 32) * ((int64_t{full_h} + 31) / 32);
  if (!cinfo->arith_code && static_cast<int64_t>(bytes.size()) * 8 < min_blocks) {
    jpeg_abort_decompress(cinfo);
    return Status::Corruption(StrCat(where, ": a JPEG of ", bytes.size(), " bytes cannot hold a ",
                                     full_w, "x", full_h, " image (it needs at least ",
                                     (min_blocks + 7) / 8, " bytes): truncated or forged"));
  }
  if (region.x < 0 || region.y < 0 || region.width <= 0 || region.height <= 0 ||
      region.x + region.width > full_w || region.y + region.height > full_h) {
    jpeg_abort_decompress(cinfo);
    return Status::InvalidArgument(StrCat(where, ": region ", region.width, "x", region.height, "+",
                                          region.x, "+", region.y, " outside the ", full_w, "x",
                                          full_h, " image"));
  }
  int s = 8;
  for (int c = 1; c < 8; ++c) {
    if (region.width * c >= min_width * 8 && region.height * c >= min_height * 8) {
      s = c;
      break;
    }
  }
  // libjpeg cannot convert CMYK/YCCK (some ImageNet files) to RGB: decode
  // CMYK and convert below, as OpenCV does.
  const bool cmyk = cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK;
  const int decoded_channels = cmyk ? 4 : channels;
  cinfo->out_color_space = cmyk ? JCS_CMYK : channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  cinfo->scale_num = s;
  cinfo->scale_denom = 8;
  jpeg_start_decompress(cinfo);
  const int out_w = static_cast<int>(cinfo->output_width);
  const int out_h = static_cast<int>(cinfo->output_height);
  // The region in output (scaled) coordinates, clipped to the output.
  const int rx = std::min(region.x * s / 8, out_w - 1);
  const int ry = std::min(region.y * s / 8, out_h - 1);
  const int rw = std::clamp((region.width * s + 7) / 8, 1, out_w - rx);
  const int rh = std::clamp((region.height * s + 7) / 8, 1, out_h - ry);
  JDIMENSION xoff = static_cast<JDIMENSION>(rx);
  JDIMENSION crop_w = static_cast<JDIMENSION>(rw);
  if (rw < out_w) jpeg_crop_scanline(cinfo, &xoff, &crop_w);
  if (ry > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(ry));
  out->Resize(rh, rw, channels);
  const bool direct = !cmyk && static_cast<int>(xoff) == rx && static_cast<int>(crop_w) == rw;
  if (!direct) row_.resize(static_cast<size_t>(crop_w) * decoded_channels);
  const size_t skip = static_cast<size_t>(rx - static_cast<int>(xoff)) * decoded_channels;
  for (int y = 0; y < rh; ++y) {
    JSAMPROW dst = direct ? out->row(y) : row_.data();
    if (jpeg_read_scanlines(cinfo, &dst, 1) != 1) {
      jpeg_abort_decompress(cinfo);
      return Status::Corruption(StrCat(where, ": JPEG ended at scanline ", ry + y));
    }
    if (cmyk) {
      // Adobe writes inverted CMYK, which is what libjpeg hands back: the
      // channel value is already 255 - ink.
      const uint8_t* src = row_.data() + skip;
      uint8_t* o = out->row(y);
      for (int x = 0; x < rw; ++x, src += 4) {
        const int k = src[3];
        const int r = src[0] * k / 255, g = src[1] * k / 255, b = src[2] * k / 255;
        if (channels == 1) {
          o[x] = static_cast<uint8_t>((r * 299 + g * 587 + b * 114 + 500) / 1000);
        } else {
          o[3 * x] = static_cast<uint8_t>(r);
          o[3 * x + 1] = static_cast<uint8_t>(g);
          o[3 * x + 2] = static_cast<uint8_t>(b);
        }
      }
    } else if (!direct) {
      std::memcpy(out->row(y), row_.data() + skip, static_cast<size_t>(rw) * channels);
    }
  }
  jpeg_abort_decompress(cinfo);  // the rows below the region are never decoded
  *scale = s / 8.0;
  return Status::Ok();
}

Status EncodeJpeg(const Image& image, int quality, std::string* out) {
  if (image.channels != 1 && image.channels != 3) {
    return Status::InvalidArgument(StrCat("JPEG encode: ", image.channels, " channels"));
  }
  jpeg_compress_struct cinfo;
  JpegError err;
  InitJpegError(&err);
  cinfo.err = &err.pub;
  unsigned char* buffer = nullptr;
  unsigned long size = 0;  // NOLINT: libjpeg's type
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    std::free(buffer);
    return Status::Internal(StrCat("JPEG encode: ", err.message));
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(image.width);
  cinfo.image_height = static_cast<JDIMENSION>(image.height);
  cinfo.input_components = image.channels;
  cinfo.in_color_space = image.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, std::clamp(quality, 1, 100), TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(image.row(static_cast<int>(cinfo.next_scanline)));
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  out->assign(reinterpret_cast<const char*>(buffer), size);
  jpeg_destroy_compress(&cinfo);
  std::free(buffer);
  return Status::Ok();
}

Status EncodePng(const Image& image, std::string* out) {
  if (image.channels != 1 && image.channels != 3) {
    return Status::InvalidArgument(StrCat("PNG encode: ", image.channels, " channels"));
  }
  png_image img;
  std::memset(&img, 0, sizeof(img));
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(image.width);
  img.height = static_cast<png_uint_32>(image.height);
  img.format = image.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  // The first call measures, the second writes.
  if (!png_image_write_to_memory(&img, nullptr, &size, 0, image.pixels.data(), 0, nullptr)) {
    return Status::Internal(StrCat("PNG encode: ", img.message));
  }
  out->resize(size);
  if (!png_image_write_to_memory(&img, out->data(), &size, 0, image.pixels.data(), 0, nullptr)) {
    return Status::Internal(StrCat("PNG encode: ", img.message));
  }
  out->resize(size);
  return Status::Ok();
}

namespace {

// Bilinear resampling: output pixel `d` (centre-aligned, scale src/dst) reads
// source pixels *i and *i + 1 with weight *a on the second; clamped at the edges.
void SourceCoord(int d, float scale, int src_size, int* i, float* a) {
  const float f = (d + 0.5f) * scale - 0.5f;
  *i = static_cast<int>(std::floor(f));
  *a = f - *i;
  if (*i < 0) {
    *i = 0;
    *a = 0;
  }
  if (*i >= src_size - 1) {
    *i = src_size - 1;
    *a = 0;
  }
}

}  // namespace

Status ShorterSideTo(int height, int width, int shorter, std::string_view where, int* out_height,
                     int* out_width) {
  const int64_t side = std::min(height, width);
  if (side <= 0 || shorter <= 0) {
    return Status::InvalidArgument(StrCat(where, ": cannot scale an image of ", width, "x", height,
                                          " to a shorter side of ", shorter));
  }
  const int64_t h = height == side ? shorter : int64_t{height} * shorter / side;
  const int64_t w = width == side ? shorter : int64_t{width} * shorter / side;
  if (h > kMaxPixels || w > kMaxPixels || h * w > kMaxPixels) {
    return Status::Corruption(StrCat(where, ": the image of ", width, "x", height,
                                     " scaled to a shorter side of ", shorter, " would be ", w, "x",
                                     h, ", larger than ", kMaxPixels, " pixels"));
  }
  *out_height = static_cast<int>(h);
  *out_width = static_cast<int>(w);
  return Status::Ok();
}

void ResizeBilinear(const Image& src, int out_height, int out_width, Image* out) {
  CHECK(src.height > 0 && src.width > 0 && out_height > 0 && out_width > 0);
  const int c = src.channels;
  out->Resize(out_height, out_width, c);
  const float sx = static_cast<float>(src.width) / out_width;
  const float sy = static_cast<float>(src.height) / out_height;
  std::vector<int> x0(out_width);
  std::vector<float> wx(out_width);
  for (int x = 0; x < out_width; ++x) SourceCoord(x, sx, src.width, &x0[x], &wx[x]);
  for (int y = 0; y < out_height; ++y) {
    int i = 0;
    float b = 0;
    SourceCoord(y, sy, src.height, &i, &b);
    const uint8_t* r0 = src.row(i);
    const uint8_t* r1 = src.row(std::min(i + 1, src.height - 1));
    uint8_t* dst = out->row(y);
    for (int x = 0; x < out_width; ++x) {
      const int a0 = x0[x] * c;
      const int a1 = std::min(x0[x] + 1, src.width - 1) * c;
      const float a = wx[x];
      for (int k = 0; k < c; ++k) {
        float top = r0[a0 + k] + a * (r0[a1 + k] - r0[a0 + k]);
        float bot = r1[a0 + k] + a * (r1[a1 + k] - r1[a0 + k]);
        dst[x * c + k] = static_cast<uint8_t>(top + b * (bot - top) + 0.5f);
      }
    }
  }
}

}  // namespace pstrain
