// Writes the seed inputs of the fuzz harnesses: well-formed examples of what
// each one reads, so fuzzing starts from inputs that get past the first check.
//   make_seeds OUT_DIR     writes OUT_DIR/{wire,recordio,readers,image,config,tar}/
// The config seeds are the job configs of configs/ (PSTRAIN_SOURCE_DIR).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/env.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"
#include "net/message.h"
#include "tests/fuzz/fuzz_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// One part of a SplitParts input: uint16 length, then the bytes.
std::string Part(const std::string& bytes) {
  const size_t n = bytes.size();
  if (n > 0xffff) std::abort();
  return std::string{static_cast<char>(n & 0xff), static_cast<char>(n >> 8)} + bytes;
}

// A data request of worker rank 0 for server rank 0: `parts` parts of 3 floats.
PsHeader DataHeader(int parts, bool push) {
  PsHeader h;
  h.set_cmd(CMD_DATA);
  h.set_sender(WorkerId(0));
  h.set_receiver(8);
  h.set_request_id(7);
  h.set_dtype(DTYPE_FLOAT32);
  h.set_push(push);
  h.set_pull(true);
  h.set_num_keys(parts);
  h.set_num_value_frames(push ? 1 : 0);
  h.set_value_bytes(push ? parts * 3 * sizeof(float) : 0);
  return h;
}

void WireSeeds(const fs::path& dir) {
  int n = 0;
  auto seed = [&](const std::string& bytes) {
    WriteFile(dir / ("seed" + std::to_string(n++)), bytes);
  };
  for (bool push : {true, false}) {
    const int parts = 2;
    const PsHeader h = DataHeader(parts, push);
    std::vector<uint64_t> keys{WireKey(0, 3, 0), WireKey(0, 5, 0)};
    std::vector<uint32_t> lens{3, 3};
    std::vector<float> values{1, 2, 3, 4, 5, 6};
    // ZeroMQ frames: routing id, header, keys, lens, values.
    std::string frames(1, '\0');
    frames += Part(NodeRoute(0x0123456789abcdef)) + Part(h.SerializeAsString()) +
              Part(Bytes(keys)) + Part(Bytes(lens));
    if (push) frames += Part(Bytes(values));
    seed(frames);
    // A queue entry: uint32 header bytes, header, padding to 8, keys, lens,
    // padding to 8, the values inline.
    const std::string header = h.SerializeAsString();
    std::string env(4, '\0');
    const uint32_t hlen = static_cast<uint32_t>(header.size());
    std::memcpy(env.data(), &hlen, 4);
    env += header;
    env.resize(QueuedKeysAt(hlen), '\0');
    env += Bytes(keys) + Bytes(lens);
    env.resize((env.size() + 7) / 8 * 8, '\0');
    if (push) env += Bytes(values);
    seed("\x01" + env);
    // Two of it in one batch frame: magic, count, 0, then per message its
    // envelope's bytes and the envelope padded to 8.
    std::string batch(kBatchMagic, sizeof(kBatchMagic));
    const uint32_t two[2] = {2, 0};
    batch.append(reinterpret_cast<const char*>(two), 8);
    for (int i = 0; i < 2; ++i) {
      const uint64_t bytes = env.size();
      batch.append(reinterpret_cast<const char*>(&bytes), 8);
      batch += env;
      batch.resize((batch.size() + 7) / 8 * 8, '\0');
    }
    std::string batched(1, '\0');
    batched += Part(NodeRoute(0x0123456789abcdef)) + Part(batch);
    seed(batched);
  }
  // A header whose value frame count wraps the frame count it implies
  // (2^64 - 2 + 4 frames is 2): the header frame alone, and with one more.
  for (const uint64_t claimed : {~uint64_t{0} - 1, ~uint64_t{0}}) {
    PsHeader h = DataHeader(2, true);
    h.set_num_value_frames(claimed);
    std::string frames(1, '\0');
    frames += Part(NodeRoute(0x0123456789abcdef)) + Part(h.SerializeAsString());
    if (claimed == ~uint64_t{0}) frames += Part(Bytes(std::vector<uint64_t>{WireKey(0, 3, 0)}));
    seed(frames);
  }
  // A 2-bit compressed push+pull of parts of 3 and 40 elements (4 and 12
  // bytes of codes), as ZeroMQ frames and as a queue entry.
  {
    PsHeader h = DataHeader(2, true);
    h.set_dtype(DTYPE_2BIT);
    h.set_value_bytes(16);
    std::vector<uint64_t> keys{WireKey(0, 3, 0), WireKey(0, 5, 0)};
    std::vector<uint32_t> lens{3, 40};
    std::vector<uint32_t> codes{0xC0u, 0x80C0C0C0u, 0x0000C080u, 0x80u};
    std::string frames(1, '\0');
    frames += Part(NodeRoute(0x0123456789abcdef)) + Part(h.SerializeAsString()) +
              Part(Bytes(keys)) + Part(Bytes(lens)) + Part(Bytes(codes));
    seed(frames);
    const std::string header = h.SerializeAsString();
    std::string env(4, '\0');
    const uint32_t hlen = static_cast<uint32_t>(header.size());
    std::memcpy(env.data(), &hlen, 4);
    env += header;
    env.resize(QueuedKeysAt(hlen), '\0');
    env += Bytes(keys) + Bytes(lens);
    env.resize((env.size() + 7) / 8 * 8, '\0');
    env += Bytes(codes);
    seed("\x01" + env);
  }
  // A control message: registration.
  PsHeader reg;
  reg.set_cmd(CMD_REGISTER);
  reg.mutable_node()->set_role(static_cast<int>(Role::kServer));
  reg.mutable_node()->set_num_servers(1);
  reg.mutable_node()->set_num_workers(1);
  reg.mutable_node()->set_host("127.0.0.1");
  reg.mutable_node()->set_port(9091);
  std::string frames(1, '\0');
  frames += Part(NodeRoute(42)) + Part(reg.SerializeAsString());
  seed(frames);
}

void RecordIOSeeds(const fs::path& dir) {
  Image image;
  image.Resize(4, 6, 3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 7);
  std::string jpeg;
  if (!EncodeJpeg(image, 90, &jpeg).ok()) std::abort();
  const std::string path = (dir / "seed0").string();
  auto writer = RecordIOWriter::Create(path);
  if (!writer.ok()) std::abort();
  // One label, several labels, and a payload holding the magic word (split
  // into pieces on disk).
  std::string magic(4, '\0');
  const uint32_t word = kRecordIOMagic;
  std::memcpy(magic.data(), &word, 4);
  for (const std::string& payload :
       {PackImageRecord(1, {3.0f}, jpeg), PackImageRecord(2, {1.0f, 0.5f}, jpeg),
        PackImageRecord(3, {0.0f}, std::string(8, 'x') + magic + "tail")}) {
    if (!(*writer)->Write(payload).ok()) std::abort();
  }
  if (!(*writer)->Close().ok()) std::abort();
}

void ReaderSeeds(const fs::path& dir) {
  auto be32 = [](uint32_t v) {
    return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                       static_cast<char>(v >> 8), static_cast<char>(v)};
  };
  // MNIST: two 28x28 images and their labels.
  std::string images = be32(0x803) + be32(2) + be32(28) + be32(28);
  for (int i = 0; i < 2 * 28 * 28; ++i) images += static_cast<char>(i % 251);
  const std::string labels = be32(0x801) + be32(2) + "\x03\x07";
  WriteFile(dir / "mnist", Part(images) + Part(labels));
  WriteFile(dir / "mnist_gz", Part(fuzz::Gzip(images)) + Part(fuzz::Gzip(labels)));
  // CIFAR-10: one record (label + 3x32x32), and a RecordIO index.
  std::string cifar(1, '\x04');
  for (int i = 0; i < 3 * 32 * 32; ++i) cifar += static_cast<char>(i % 253);
  WriteFile(dir / "cifar", Part(cifar) + Part("0\t0\n1\t3088\n"));
}

// One tar header block: ustar, octal fields, its checksum.
std::string TarHeader(const std::string& name, char type, size_t size,
                      const std::string& prefix = "") {
  std::string h(512, '\0');
  auto put = [&h](size_t at, const std::string& v) { h.replace(at, v.size(), v); };
  auto octal = [](size_t width, uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%0*llo", static_cast<int>(width - 1),
                  static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  put(0, name);
  put(100, octal(8, type == '5' ? 0755 : 0644));
  put(108, octal(8, 0));
  put(116, octal(8, 0));
  put(124, octal(12, size));
  put(136, octal(12, 1700000000));
  h[156] = type;
  put(257, std::string("ustar\0"
                       "00",
                       8));
  put(345, prefix);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += (i >= 148 && i < 156) ? ' ' : static_cast<uint8_t>(h[i]);
  put(148, octal(7, sum));
  h[155] = ' ';
  return h;
}

// A member: its header and its data padded to 512 bytes.
std::string TarMember(const std::string& name, char type, const std::string& data,
                      const std::string& prefix = "") {
  std::string m = TarHeader(name, type, data.size(), prefix) + data;
  m.resize((m.size() + 511) / 512 * 512, '\0');
  return m;
}

// The first byte selects the harness's mode (tests/fuzz/fuzz_tar.cc): 0 the
// tar stream, 4 the same with checksums fixed up, 1 the gzipped file, 2 with
// the CIFAR-10 strip prefix.
void TarSeeds(const fs::path& dir) {
  const std::string end(1024, '\0');
  const std::string plain = TarMember("data/", '5', "") + TarMember("data/a.bin", '0', "abc") +
                            TarMember("b.txt", '0', std::string(600, 'x'), "data") + end;
  const std::string cifar = TarMember("cifar-10-batches-bin/", '5', "") +
                            TarMember("cifar-10-batches-bin/test_batch.bin", '0', "1234") + end;
  const std::string long_name(150, 'n');
  const std::string gnu = TarMember("././@LongLink", 'L', long_name + '\0') +
                          TarMember(long_name.substr(0, 99), '0', "long") + end;
  const std::string pax =
      TarMember("PaxHeaders/x", 'x', "21 path=pax/file.txt\n") + TarMember("x", '0', "pax") + end;
  WriteFile(dir / "plain", std::string(1, '\0') + plain);
  WriteFile(dir / "plain_fixed", std::string(1, '\4') + plain);
  WriteFile(dir / "plain_gz", std::string(1, '\1') + fuzz::Gzip(plain));
  WriteFile(dir / "cifar", std::string(1, '\6') + cifar);
  WriteFile(dir / "gnu", std::string(1, '\4') + gnu);
  WriteFile(dir / "pax", std::string(1, '\4') + pax);
  // Refused: a symbolic link and a path that climbs out.
  WriteFile(dir / "link", std::string(1, '\4') + TarMember("l", '2', "") + end);
  WriteFile(dir / "climb", std::string(1, '\4') + TarMember("../up.txt", '0', "up") + end);
}

void ImageSeeds(const fs::path& dir) {
  for (int channels : {3, 1}) {
    Image image;
    image.Resize(5, 7, channels);
    for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = static_cast<uint8_t>(i * 13);
    std::string jpeg;
    if (!EncodeJpeg(image, 75, &jpeg).ok()) std::abort();
    WriteFile(dir / ("jpeg" + std::to_string(channels)), jpeg);
  }
}

void ConfigSeeds(const fs::path& dir) {
  const fs::path configs = fs::path(PSTRAIN_SOURCE_DIR) / "configs";
  for (const auto& entry : fs::directory_iterator(configs)) {
    if (entry.path().extension() == ".cfg")
      fs::copy_file(entry.path(), dir / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
  }
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  using namespace pstrain;
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds OUT_DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  const std::pair<const char*, void (*)(const fs::path&)> kinds[] = {
      {"wire", WireSeeds},   {"recordio", RecordIOSeeds}, {"readers", ReaderSeeds},
      {"image", ImageSeeds}, {"config", ConfigSeeds},     {"tar", TarSeeds}};
  for (const auto& [name, make] : kinds) {
    fs::create_directories(out / name);
    make(out / name);
  }
  return 0;
}
