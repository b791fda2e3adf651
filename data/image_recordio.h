// The payload of an MXNet image record (src/io/image_recordio.h and python
// recordio.pack): a 24-byte header, struct `IfQQ` little-endian
//   uint32 flag | float32 label | uint64 id | uint64 id2
// then, when flag = L > 0, L float32 labels (the header's `label` is then 0),
// then the encoded image (JPEG, PNG or raw bytes).
#ifndef PSTRAIN_DATA_IMAGE_RECORDIO_H_
#define PSTRAIN_DATA_IMAGE_RECORDIO_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace pstrain {

inline constexpr size_t kImageRecordHeaderSize = 24;

struct ImageRecordHeader {
  uint32_t flag = 0;  // 0: one label in `label`; L > 0: L labels follow the header
  float label = 0.0f;
  uint64_t id = 0;
  uint64_t id2 = 0;  // reserved, 0
};

// A parsed record; `image` views the payload passed to ParseImageRecord.
struct ImageRecordView {
  ImageRecordHeader header;
  std::vector<float> labels;  // {header.label} when flag == 0, else the flag labels
  std::string_view image;
};

// Builds a payload. One label: flag 0 and the label in the header; several:
// flag = labels.size() and the header's label 0, as MXNet's packer does.
std::string PackImageRecord(uint64_t id, const std::vector<float>& labels,
                            std::string_view image_bytes);

// Parses `payload`. A payload shorter than its header and labels is
// Corruption; `where` ("file.rec:1234") goes into the message.
Status ParseImageRecord(std::string_view payload, std::string_view where, ImageRecordView* out);

}  // namespace pstrain

#endif  // PSTRAIN_DATA_IMAGE_RECORDIO_H_
