// Image decoding (JPEG, PNG) as the image pipeline does it: the size, whole
// images in colour and gray, and a random crop decoded on its own (its
// region inside the size read from the header, as the augmenter picks it).
#include <cstdint>
#include <string_view>

#include "data/image_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pstrain;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  (void)DetectImageFormat(bytes);
  ImageDecoder decoder;
  Image image;
  for (int channels : {3, 1}) (void)decoder.Decode(bytes, "fuzz", channels, &image);
  int height = 0, width = 0;
  if (!decoder.ReadSize(bytes, "fuzz", &height, &width).ok() || height < 2 || width < 2) return 0;
  const Rect region{width / 4, height / 3, width / 2, height / 2};
  double scale = 1;
  (void)decoder.DecodeRegion(bytes, "fuzz", 3, region, 1, 1, &image, &scale);
  return 0;
}
