#include "data/image_recordio.h"

#include <cstring>

namespace pstrain {

std::string PackImageRecord(uint64_t id, const std::vector<float>& labels,
                            std::string_view image_bytes) {
  const bool multi = labels.size() > 1;
  const uint32_t flag = multi ? static_cast<uint32_t>(labels.size()) : 0u;
  const float label = multi || labels.empty() ? 0.0f : labels[0];
  const uint64_t id2 = 0;
  std::string out;
  out.resize(kImageRecordHeaderSize + (multi ? labels.size() * 4 : 0) + image_bytes.size());
  char* p = out.data();
  std::memcpy(p, &flag, 4);
  std::memcpy(p + 4, &label, 4);
  std::memcpy(p + 8, &id, 8);
  std::memcpy(p + 16, &id2, 8);
  p += kImageRecordHeaderSize;
  if (multi) {
    std::memcpy(p, labels.data(), labels.size() * 4);
    p += labels.size() * 4;
  }
  if (!image_bytes.empty()) std::memcpy(p, image_bytes.data(), image_bytes.size());
  return out;
}

Status ParseImageRecord(std::string_view payload, std::string_view where, ImageRecordView* out) {
  if (payload.size() < kImageRecordHeaderSize) {
    return Status::Corruption(StrCat(where, ": image record of ", payload.size(),
                                     " bytes is shorter than its 24-byte header"));
  }
  const char* p = payload.data();
  ImageRecordHeader& h = out->header;
  std::memcpy(&h.flag, p, 4);
  std::memcpy(&h.label, p + 4, 4);
  std::memcpy(&h.id, p + 8, 8);
  std::memcpy(&h.id2, p + 16, 8);
  size_t pos = kImageRecordHeaderSize;
  if (h.flag == 0) {
    out->labels.assign(1, h.label);
  } else {
    size_t label_bytes = static_cast<size_t>(h.flag) * 4;
    if (payload.size() - pos < label_bytes) {
      return Status::Corruption(StrCat(where, ": image record announces ", h.flag,
                                       " labels but has only ", payload.size() - pos,
                                       " bytes after its header"));
    }
    out->labels.resize(h.flag);
    std::memcpy(out->labels.data(), p + pos, label_bytes);
    pos += label_bytes;
  }
  out->image = payload.substr(pos);
  return Status::Ok();
}

}  // namespace pstrain
