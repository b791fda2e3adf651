// `pstrain rec ls|unpack|index|check` and data/rec_tools.h.
//
// The library tests use files our own writer makes. The command tests use a
// file made by an independent writer: a Python script (below) that follows the
// format description in ../shared/reference/mxnet_facts.md 3.4, encodes JPEG
// and PNG images with PIL, splits records where the payload holds the magic
// word, and writes what it wrote (ids, labels, offsets, sizes, channel means
// as PIL decodes them) as JSON. Without python3 and PIL (Debian python3-pil)
// those tests skip.
#include "data/rec_tools.h"

#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>

#include "data/im2rec.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string part; std::getline(ss, part, sep);) out.push_back(part);
  return out;
}

// Runs a shell command, with its stderr folded into *output or dropped;
// returns its exit code.
int RunShell(const std::string& cmd, std::string* output, bool keep_stderr = true) {
  return testing::RunShell(cmd + (keep_stderr ? " 2>&1" : " 2>/dev/null"), output);
}
// Runs `pstrain <args>`.
int RunPstrain(const std::string& args, std::string* output) {
  return RunShell(testing::PstrainBinary() + " " + args, output);
}
// Runs `pstrain <args>` and keeps only its stdout.
int RunPstrainStdout(const std::string& args, std::string* output) {
  return RunShell(testing::PstrainBinary() + " " + args, output, /*keep_stderr=*/false);
}

std::string JpegOf(int h, int w, int c, uint8_t value) {
  Image img;
  img.Resize(h, w, c);
  std::fill(img.pixels.begin(), img.pixels.end(), value);
  std::string jpeg;
  CHECK_OK(EncodeJpeg(img, 95, &jpeg));
  return jpeg;
}

float MagicAsFloat() {
  const uint32_t magic = kRecordIOMagic;
  float f;
  std::memcpy(&f, &magic, 4);
  return f;
}

class RecToolsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("rec-tools");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `payloads` with our writer; returns their offsets.
  std::vector<uint64_t> WriteRecords(const std::string& path,
                                     const std::vector<std::string>& payloads) {
    auto writer = RecordIOWriter::Create(path);
    EXPECT_TRUE(writer.ok()) << writer.status();
    std::vector<uint64_t> offsets;
    for (const std::string& p : payloads) {
      offsets.push_back((*writer)->Tell());
      EXPECT_OK((*writer)->Write(p));
    }
    EXPECT_OK((*writer)->Close());
    return offsets;
  }

  std::vector<ScannedRecord> Scan(const RecordIOFile& file, const ScanOptions& opts) {
    std::vector<ScannedRecord> out;
    EXPECT_OK(ScanImageRecords(file, opts, [&](const ScannedRecord& r) {
      out.push_back(r);
      out.back().payload = std::string_view();  // the views die with the callback
      out.back().record.image = std::string_view();
      return Status::Ok();
    }));
    return out;
  }

  std::string dir_;
};

TEST_F(RecToolsTest, ScanDecodesSplitRecordsAndGoesOnAfterDamage) {
  // Record 1 carries the magic word as its second label: it is split in two.
  const std::vector<std::string> payloads = {
      PackImageRecord(10, {1}, JpegOf(8, 12, 3, 200)),
      PackImageRecord(11, {2, MagicAsFloat(), 3}, JpegOf(9, 5, 1, 60)),
      PackImageRecord(12, {4}, JpegOf(16, 16, 3, 30)),
  };
  const std::vector<uint64_t> offsets = WriteRecords(Path("a.rec"), payloads);
  auto file = RecordIOFile::Open(Path("a.rec"));
  ASSERT_TRUE(file.ok()) << file.status();
  ScanOptions opts;
  opts.num_threads = 2;
  std::vector<ScannedRecord> recs = Scan(**file, opts);
  ASSERT_EQ(recs.size(), 3u);
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_TRUE(recs[i].ok()) << recs[i].status;
    EXPECT_EQ(recs[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(recs[i].offset, offsets[i]);
    EXPECT_EQ(recs[i].record.header.id, 10 + i);
  }
  EXPECT_EQ(recs[0].pieces, 1);
  EXPECT_EQ(recs[1].pieces, 2);
  EXPECT_EQ(recs[1].end, offsets[2]);
  ASSERT_EQ(recs[1].record.labels.size(), 3u);
  EXPECT_EQ(recs[1].record.labels[2], 3.0f);
  EXPECT_EQ(recs[0].image.width, 12);
  EXPECT_EQ(recs[0].image.height, 8);
  EXPECT_EQ(recs[0].image.channels, 3);
  EXPECT_EQ(recs[1].image.channels, 1);
  ASSERT_EQ(recs[0].channel_means.size(), 3u);
  for (double m : recs[0].channel_means) EXPECT_NEAR(m, 200, 1.0);
  ASSERT_EQ(recs[1].channel_means.size(), 1u);
  EXPECT_NEAR(recs[1].channel_means[0], 60, 1.0);

  // Damage record 1's magic: it is reported at its offset, record 2 keeps its place.
  std::string bytes = ReadAll(Path("a.rec"));
  bytes[offsets[1]] ^= 0x5A;
  WriteAll(Path("b.rec"), bytes);
  auto bad = RecordIOFile::Open(Path("b.rec"));
  ASSERT_TRUE(bad.ok());
  recs = Scan(**bad, opts);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_TRUE(recs[0].ok());
  EXPECT_EQ(recs[1].problem, RecordProblem::kFraming);
  EXPECT_EQ(recs[1].offset, offsets[1]);
  EXPECT_EQ(recs[1].end, offsets[2]);
  EXPECT_THAT(recs[1].status.message(), HasSubstr(StrCat("b.rec:", offsets[1], ": bad RecordIO")));
  EXPECT_TRUE(recs[2].ok()) << recs[2].status;
  EXPECT_EQ(recs[2].index, 2);
  EXPECT_EQ(recs[2].record.header.id, 12u);
}

TEST_F(RecToolsTest, ScanReportsShortHeadersLabelCountsAndBadImages) {
  const std::vector<std::string> payloads = {
      "short",
      PackImageRecord(1, {1, 2}, "").substr(0, 30),  // announces 2 labels, holds 1.5
      PackImageRecord(2, {1, 2}, JpegOf(4, 4, 3, 9)),
      PackImageRecord(3, {1}, "not an image"),
      PackImageRecord(4, {1}, JpegOf(4, 4, 3, 9)),
  };
  const std::vector<uint64_t> offsets = WriteRecords(Path("a.rec"), payloads);
  auto file = RecordIOFile::Open(Path("a.rec"));
  ASSERT_TRUE(file.ok());
  ScanOptions opts;
  opts.label_width = 1;
  std::vector<ScannedRecord> recs = Scan(**file, opts);
  ASSERT_EQ(recs.size(), 5u);
  EXPECT_EQ(recs[0].problem, RecordProblem::kHeader);
  EXPECT_EQ(recs[1].problem, RecordProblem::kLabelCount);
  EXPECT_EQ(recs[2].problem, RecordProblem::kLabelCount);
  EXPECT_THAT(recs[2].status.message(), HasSubstr("2 labels, expected 1"));
  EXPECT_EQ(recs[3].problem, RecordProblem::kImage);
  EXPECT_THAT(recs[3].status.message(), HasSubstr(StrCat("a.rec:", offsets[3], ": not a JPEG")));
  EXPECT_TRUE(recs[4].ok()) << recs[4].status;

  RecordFileSummary summary((*file)->size());
  for (const ScannedRecord& r : recs) summary.Add(r);
  EXPECT_EQ(summary.records(), 5);
  EXPECT_EQ(summary.bad(), 4);
  const std::string text = summary.ToString();
  EXPECT_THAT(text, HasSubstr("records: 5 (4 bad)"));
  EXPECT_THAT(text, HasSubstr("header 1 label count 2 image 1"));
  EXPECT_THAT(text, HasSubstr("image sizes: 1 distinct"));
  EXPECT_THAT(text, HasSubstr("4x4x3 (1)"));
}

TEST_F(RecToolsTest, PagesReleasedBehindAScanAreReadAgain) {
  // About 600 KB of records: many pages and three scan blocks.
  std::vector<std::string> payloads;
  for (int i = 0; i < 600; ++i) {
    payloads.push_back(PackImageRecord(i, {1}, std::string(1000 + i, static_cast<char>(i))));
  }
  const std::vector<uint64_t> offsets = WriteRecords(Path("big.rec"), payloads);
  auto file = RecordIOFile::Open(Path("big.rec"));
  ASSERT_TRUE(file.ok());
  ScanOptions opts;
  opts.depth = RecordScanDepth::kHeader;
  int64_t seen = 0;
  ASSERT_OK(ScanImageRecords(**file, opts, [&](const ScannedRecord& r) {
    EXPECT_EQ(r.payload, payloads[r.index]);
    ++seen;
    return Status::Ok();
  }));
  EXPECT_EQ(seen, 600);
  for (int i : {0, 300, 599}) {
    std::string_view rec;
    std::string scratch;
    ASSERT_OK((*file)->ReadAt(offsets[i], &rec, &scratch, nullptr));
    EXPECT_EQ(rec, payloads[i]);
  }
  (*file)->ReleaseRange(0, (*file)->size());
  std::string_view rec;
  ASSERT_OK((*file)->ReadAt(offsets[599], &rec, nullptr, nullptr));
  EXPECT_EQ(rec, payloads[599]);
}

TEST_F(RecToolsTest, ReadInfoGivesTheNativeChannels) {
  ImageDecoder decoder;
  ImageInfo info;
  ASSERT_OK(decoder.ReadInfo(JpegOf(5, 7, 1, 3), "g.jpg", &info));
  EXPECT_EQ(info.format, ImageFormat::kJpeg);
  EXPECT_EQ(info.width, 7);
  EXPECT_EQ(info.height, 5);
  EXPECT_EQ(info.channels, 1);
  ASSERT_OK(decoder.ReadInfo(JpegOf(5, 7, 3, 3), "c.jpg", &info));
  EXPECT_EQ(info.channels, 3);
  // A PNG header: signature, IHDR length and type, width 9, height 4, depth 8, colour type.
  for (const auto& [color_type, channels] :
       std::vector<std::pair<int, int>>{{0, 1}, {2, 3}, {3, 3}, {4, 1}, {6, 3}}) {
    std::string png("\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x09\0\0\0\x04\x08", 25);
    png += static_cast<char>(color_type);
    png += std::string(7, '\0');
    ASSERT_OK(decoder.ReadInfo(png, "p.png", &info));
    EXPECT_EQ(info.format, ImageFormat::kPng);
    EXPECT_EQ(info.width, 9);
    EXPECT_EQ(info.height, 4);
    EXPECT_EQ(info.channels, channels) << "colour type " << color_type;
  }
  EXPECT_EQ(decoder.ReadInfo("GIF89a", "x.gif", &info).code(), StatusCode::kCorruption);
}

TEST_F(RecToolsTest, LabelsAreWrittenSoThatTheyReadBack) {
  EXPECT_EQ(FormatLabel(3), "3");
  EXPECT_EQ(FormatLabel(0.25f), "0.25");
  EXPECT_EQ(FormatListLabel(3), "3.000000");
  EXPECT_EQ(FormatListLabel(-1.5f), "-1.500000");
  for (float v : {1.0f / 3, MagicAsFloat(), 1e-7f, 123456.789f, -0.1f}) {
    EXPECT_EQ(std::strtof(FormatLabel(v).c_str(), nullptr), v) << FormatLabel(v);
    EXPECT_EQ(std::strtof(FormatListLabel(v).c_str(), nullptr), v) << FormatListLabel(v);
  }
  EXPECT_NE(FormatListLabel(1.0f / 3), "0.333333");
}

TEST_F(RecToolsTest, IndexOfAnIm2recFileIsIm2recsIndex) {
  fs::create_directories(Path("root/b"));
  WriteAll(Path("root/b/x.jpg"), JpegOf(10, 12, 3, 100));
  WriteAll(Path("root/b/y.jpg"), JpegOf(12, 10, 3, 50));
  WriteAll(Path("root/c.jpg"), JpegOf(6, 6, 3, 150));
  ASSERT_OK(WriteImageList(Path("l.lst"),
                           {{7, {1}, "b/x.jpg"}, {3, {2}, "b/y.jpg"}, {12, {0}, "c.jpg"}}));
  PackStats stats;
  ASSERT_OK(PackImageList(Path("l.lst"), Path("root"), Path("l.rec"), Path("l.idx"), PackOptions(),
                          &stats));
  ASSERT_EQ(stats.written, 3);
  auto file = RecordIOFile::Open(Path("l.rec"));
  ASSERT_TRUE(file.ok());
  auto built = BuildRecordIndex(**file, IndexKey::kId);
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_OK(WriteRecordIndex(Path("rebuilt.idx"), *built));
  EXPECT_EQ(ReadAll(Path("rebuilt.idx")), ReadAll(Path("l.idx")));
  auto by_position = BuildRecordIndex(**file, IndexKey::kPosition);
  ASSERT_TRUE(by_position.ok());
  ASSERT_EQ(by_position->size(), 3u);
  EXPECT_EQ((*by_position)[2].key, 2u);
  EXPECT_EQ((*by_position)[2].offset, (*built)[2].offset);

  std::vector<RecordStart> starts;
  for (size_t i = 0; i < built->size(); ++i) {
    starts.push_back(RecordStart{(*built)[i].offset, (*built)[i].key, static_cast<int64_t>(i)});
  }
  EXPECT_TRUE(CompareRecordIndex("l.idx", *built, starts).empty());
  EXPECT_TRUE(CompareRecordIndex("l.idx", *by_position, starts).empty());
  std::vector<RecordIndexEntry> wrong = *built;
  wrong[1].key = 99;
  wrong[2].offset += 4;
  const std::vector<std::string> problems = CompareRecordIndex("l.idx", wrong, starts);
  ASSERT_EQ(problems.size(), 3u);
  EXPECT_THAT(problems[0], HasSubstr("entry 1: key 99 but the record at byte"));
  EXPECT_THAT(problems[1], HasSubstr(StrCat("byte ", wrong[2].offset, " is not the start")));
  EXPECT_THAT(problems[2], HasSubstr("1 record(s) not in the index, the first record 2"));
}

TEST_F(RecToolsTest, UnpackCountsRecordsIm2recCannotRebuild) {
  // flag 1 with one label in the list: im2rec stores one label as flag 0.
  std::string flag_one = PackImageRecord(5, {2, 3}, JpegOf(4, 4, 3, 1));
  const uint32_t one = 1;
  std::memcpy(&flag_one[0], &one, 4);
  flag_one.erase(28, 4);  // drop the second label
  WriteRecords(Path("x.rec"), {PackImageRecord(4, {1}, JpegOf(4, 4, 3, 1)), flag_one,
                               PackImageRecord(4, {7}, "raw")});
  auto file = RecordIOFile::Open(Path("x.rec"));
  ASSERT_TRUE(file.ok());
  UnpackStats stats;
  ASSERT_OK(UnpackRecordFile(**file, Path("out"), UnpackOptions(), nullptr, &stats));
  EXPECT_EQ(stats.written, 3);
  EXPECT_EQ(stats.not_repackable, 1);
  EXPECT_EQ(stats.list_path, Path("out/x.lst"));
  // A repeated id gets the record's position; bytes of unknown format go to .bin.
  EXPECT_EQ(ReadAll(Path("out/x.lst")),
            "4\t1.000000\t4.jpg\n5\t2.000000\t5.jpg\n4\t7.000000\t4_2.bin\n");
  EXPECT_EQ(ReadAll(Path("out/4_2.bin")), "raw");
  // The folder now holds files.
  Status s = UnpackRecordFile(**file, Path("out"), UnpackOptions(), nullptr, &stats);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("--force"));
  UnpackOptions force;
  force.force = true;
  EXPECT_OK(UnpackRecordFile(**file, Path("out"), force, nullptr, &stats));
}

// ---- the commands, on files from the independent writer ----

constexpr char kWriterScript[] = R"PY(
# Writes data.rec, data.idx, images/ and expected.json into the folder argv[1],
# from the format description alone (no code shared with pstrain).
import io, json, os, random, struct, sys, zlib
from PIL import Image, ImageStat

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack('<I', MAGIC)
out = sys.argv[1]
rng = random.Random(17)


def picture(mode, w, h):
    # A tone per channel, a gradient and noise: every image has its own means.
    bands = 1 if mode == 'L' else 3
    tones = [rng.randint(40, 200) for _ in range(bands)]
    px = bytearray()
    for y in range(h):
        for x in range(w):
            for c in range(bands):
                v = tones[c] + (x * 40 // w) - (y * 30 // h) + rng.randint(-20, 20)
                px.append(max(0, min(255, v)))
    return Image.frombytes(mode, (w, h), bytes(px))


def encode(img, fmt, quality):
    buf = io.BytesIO()
    if fmt == 'jpg':
        img.save(buf, 'JPEG', quality=quality)
    else:
        img.save(buf, 'PNG')
    return buf.getvalue()


def magic_run(pos):
    # Filler so that the first magic word starts at a payload offset that is a
    # multiple of 4 (pos: payload offset of the filler), then magic, 4 bytes,
    # and two magic words in a row: pieces with cflag 1, 2, 2 (empty), 3.
    pad = (-pos) % 4
    return b'p' * pad + MAGIC_BYTES + b'abcd' + MAGIC_BYTES + MAGIC_BYTES + b'tail'


def with_jpeg_comment(jpeg, image_pos):
    # A COM segment (FF FE, 2-byte big-endian length) right after SOI.
    data = magic_run(image_pos + 6)
    return jpeg[:2] + b'\xff\xfe' + struct.pack('>H', len(data) + 2) + data + jpeg[2:]


def with_png_chunk(png, image_pos):
    # A private ancillary chunk "mgIc" right after IHDR (8 + 25 bytes in).
    data = magic_run(image_pos + 41)[:-4]  # one magic word fewer: cflag 1, 2, 3
    data = data[:data.rfind(MAGIC_BYTES)] + b'tail'
    chunk = struct.pack('>I', len(data)) + b'mgIc' + data
    chunk += struct.pack('>I', zlib.crc32(b'mgIc' + data) & 0xFFFFFFFF)
    return png[:33] + chunk + png[33:]


def pack(rec_id, labels, image):
    if len(labels) == 1:
        head = struct.pack('<IfQQ', 0, labels[0], rec_id, 0)
    else:
        head = struct.pack('<IfQQ', len(labels), 0.0, rec_id, 0)
        head += struct.pack('<%df' % len(labels), *labels)
    return head + image


def write_record(f, payload):
    start = f.tell()
    pieces = []
    begin = 0
    for i in range(0, len(payload) & ~3, 4):
        if payload[i:i + 4] == MAGIC_BYTES:
            pieces.append((1 if begin == 0 else 2, payload[begin:i]))
            begin = i + 4
    pieces.append((3 if begin else 0, payload[begin:]))
    for cflag, data in pieces:
        f.write(struct.pack('<II', MAGIC, (cflag << 29) | len(data)))
        f.write(data)
        f.write(b'\0' * ((4 - len(data) % 4) % 4))
    return start, len(pieces)


magic_float = struct.unpack('<f', MAGIC_BYTES)[0]
third = struct.unpack('<f', struct.pack('<f', 1.0 / 3))[0]
# (id, labels, mode, width, height, format, quality, trick)
specs = [
    (1000, [3.0], 'RGB', 32, 24, 'jpg', 90, None),
    (1007, [1.0], 'L', 17, 9, 'jpg', 85, None),
    (1014, [0.0, 2.5, 7.0], 'RGB', 40, 30, 'png', 0, None),
    (1021, [4.0], 'L', 13, 7, 'png', 0, None),
    (1028, [2.0, 5.0], 'RGB', 64, 48, 'jpg', 90, 'comment'),
    (1035, [1.0], 'RGB', 21, 19, 'png', 0, 'chunk'),
    (1042, [magic_float, 0.25, -1.0], 'L', 50, 33, 'jpg', 80, None),
    (MAGIC, [6.0], 'RGB', 9, 11, 'jpg', 95, None),
    (1056, [third], 'RGB', 100, 75, 'jpg', 75, None),
    (1063, [9.0], 'L', 8, 8, 'png', 0, None),
    (1070, [7.0], 'RGB', 48, 40, 'jpg', 90, None),
]
records = []
os.makedirs(os.path.join(out, 'images'), exist_ok=True)
with open(os.path.join(out, 'data.rec'), 'wb') as f, \
        open(os.path.join(out, 'data.idx'), 'w') as idx:
    for index, (rec_id, labels, mode, w, h, fmt, quality, trick) in enumerate(specs):
        image = encode(picture(mode, w, h), fmt, quality)
        image_pos = 24 + (4 * len(labels) if len(labels) > 1 else 0)
        if trick == 'comment':
            image = with_jpeg_comment(image, image_pos)
        elif trick == 'chunk':
            image = with_png_chunk(image, image_pos)
        decoded = Image.open(io.BytesIO(image))
        decoded.load()
        assert decoded.size == (w, h) and decoded.mode == mode
        offset, pieces = write_record(f, pack(rec_id, labels, image))
        idx.write('%d\t%d\n' % (rec_id, offset))
        name = '%d.%s' % (rec_id, fmt)
        with open(os.path.join(out, 'images', name), 'wb') as img_file:
            img_file.write(image)
        records.append({
            'index': index, 'offset': offset, 'id': rec_id, 'labels': labels,
            'pieces': pieces, 'bytes': len(image), 'width': w, 'height': h,
            'channels': 1 if mode == 'L' else 3, 'format': fmt, 'file': name,
            'means': ImageStat.Stat(decoded).mean,
            'image_offset': offset + 8 + image_pos if pieces == 1 else -1,
        })
    size = f.tell()
with open(os.path.join(out, 'expected.json'), 'w') as f:
    json.dump({'records': records, 'file_bytes': size}, f, indent=1)
)PY";

// What the Python writer says about one record.
struct Expected {
  int64_t index = 0;
  uint64_t offset = 0;
  uint64_t id = 0;
  std::vector<float> labels;
  int pieces = 0;
  size_t bytes = 0;
  int width = 0, height = 0, channels = 0;
  std::string format, file;
  std::vector<double> means;
  int64_t image_offset = -1;
};

class RecCommandTest : public RecToolsTest {
 protected:
  void SetUp() override {
    RecToolsTest::SetUp();
    std::string python = "/usr/bin/python3", out;
    if (access(python.c_str(), X_OK) != 0) python = "python3";
    if (RunShell(python + " -c 'import PIL'", &out) != 0) {
      GTEST_SKIP() << "needs python3 with PIL (Debian: python3 python3-pil, in "
                      "scripts/install-deps.sh) to write the test files: "
                   << out;
    }
    WriteAll(Path("writer.py"), kWriterScript);
    ASSERT_EQ(RunShell(python + " " + Path("writer.py") + " " + dir_, &out), 0) << out;
    google::protobuf::Struct json;
    const auto parsed =
        google::protobuf::util::JsonStringToMessage(ReadAll(Path("expected.json")), &json);
    ASSERT_TRUE(parsed.ok()) << parsed.ToString();
    file_bytes_ = static_cast<uint64_t>(json.fields().at("file_bytes").number_value());
    for (const auto& v : json.fields().at("records").list_value().values()) {
      const auto& f = v.struct_value().fields();
      Expected e;
      e.index = static_cast<int64_t>(f.at("index").number_value());
      e.offset = static_cast<uint64_t>(f.at("offset").number_value());
      e.id = static_cast<uint64_t>(f.at("id").number_value());
      for (const auto& l : f.at("labels").list_value().values()) {
        e.labels.push_back(static_cast<float>(l.number_value()));
      }
      e.pieces = static_cast<int>(f.at("pieces").number_value());
      e.bytes = static_cast<size_t>(f.at("bytes").number_value());
      e.width = static_cast<int>(f.at("width").number_value());
      e.height = static_cast<int>(f.at("height").number_value());
      e.channels = static_cast<int>(f.at("channels").number_value());
      e.format = f.at("format").string_value();
      e.file = f.at("file").string_value();
      for (const auto& m : f.at("means").list_value().values()) e.means.push_back(m.number_value());
      e.image_offset = static_cast<int64_t>(f.at("image_offset").number_value());
      expected_.push_back(std::move(e));
    }
    ASSERT_EQ(expected_.size(), 11u);
  }

  // `rec ls` lines (comments dropped), split at tabs.
  static std::vector<std::vector<std::string>> LsRows(const std::string& out) {
    std::vector<std::vector<std::string>> rows;
    for (const std::string& line : Split(out, '\n')) {
      if (!line.empty() && line[0] != '#') rows.push_back(Split(line, '\t'));
    }
    return rows;
  }

  void ExpectRowMatches(const std::vector<std::string>& row, const Expected& e, bool means) {
    ASSERT_EQ(row.size(), 7u);
    EXPECT_EQ(row[0], std::to_string(e.index));
    EXPECT_EQ(row[1], std::to_string(e.offset));
    EXPECT_EQ(row[2], std::to_string(e.id));
    const std::vector<std::string> labels = Split(row[3], ',');
    ASSERT_EQ(labels.size(), e.labels.size()) << row[3];
    for (size_t i = 0; i < labels.size(); ++i) {
      EXPECT_EQ(std::strtof(labels[i].c_str(), nullptr), e.labels[i]) << row[3];
    }
    EXPECT_EQ(row[4], std::to_string(e.bytes));
    EXPECT_EQ(row[5], StrCat(e.width, "x", e.height, "x", e.channels));
    if (!means) {
      EXPECT_EQ(row[6], "-");
      return;
    }
    const std::vector<std::string> got = Split(row[6], ',');
    ASSERT_EQ(got.size(), e.means.size()) << row[6];
    // PNG decodes exactly (the means are printed to 2 decimals); JPEG decoders
    // may round differently.
    const double tolerance = e.format == "png" ? 0.006 : 0.5;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(std::strtod(got[i].c_str(), nullptr), e.means[i], tolerance)
          << "record " << e.index << " channel " << i;
    }
  }

  uint64_t file_bytes_ = 0;
  std::vector<Expected> expected_;
};

TEST_F(RecCommandTest, TheWritersFileHasSplitRecords) {
  auto file = RecordIOFile::Open(Path("data.rec"));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->size(), file_bytes_);
  ScanOptions opts;
  opts.depth = RecordScanDepth::kHeader;
  std::vector<ScannedRecord> recs = Scan(**file, opts);
  ASSERT_EQ(recs.size(), expected_.size());
  int split = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_TRUE(recs[i].ok()) << recs[i].status;
    EXPECT_EQ(recs[i].offset, expected_[i].offset);
    EXPECT_EQ(recs[i].pieces, expected_[i].pieces) << "record " << i;
    EXPECT_EQ(recs[i].record.labels, expected_[i].labels) << "record " << i;
    split += recs[i].pieces > 1;
  }
  EXPECT_EQ(split, 4);
  EXPECT_EQ(expected_[4].pieces, 4);  // cflag 1, 2, 2 (empty), 3
}

TEST_F(RecCommandTest, LsPrintsWhatTheWriterWrote) {
  std::string out;
  ASSERT_EQ(RunPstrainStdout("rec ls --threads 2 " + Path("data.rec"), &out), 0) << out;
  EXPECT_EQ(out.rfind("# index\toffset\tid\tlabels\tbytes\timage\tmeans\n", 0), 0u) << out;
  auto rows = LsRows(out);
  ASSERT_EQ(rows.size(), expected_.size()) << out;
  for (size_t i = 0; i < rows.size(); ++i) ExpectRowMatches(rows[i], expected_[i], true);

  ASSERT_EQ(RunPstrainStdout("rec ls --no-decode " + Path("data.rec"), &out), 0) << out;
  rows = LsRows(out);
  ASSERT_EQ(rows.size(), expected_.size()) << out;
  for (size_t i = 0; i < rows.size(); ++i) ExpectRowMatches(rows[i], expected_[i], false);

  EXPECT_EQ(RunPstrain("rec ls " + Path("nothing.rec"), &out), 1);
  EXPECT_THAT(out, HasSubstr("nothing.rec"));
  EXPECT_EQ(RunPstrain("rec ls", &out), 2);
  EXPECT_THAT(out, HasSubstr("usage: pstrain rec"));
  EXPECT_EQ(RunPstrain("rec ls --threads 0 " + Path("data.rec"), &out), 2);
  EXPECT_THAT(out, HasSubstr("--threads"));
  EXPECT_EQ(RunPstrain("rec frobnicate x", &out), 2);
  EXPECT_THAT(out, HasSubstr("unknown subcommand 'frobnicate'"));
}

TEST_F(RecCommandTest, UnpackGivesTheOriginalBytesAndIm2recPacksThemBackIdentically) {
  std::string out;
  ASSERT_EQ(RunPstrain("rec unpack " + Path("data.rec") + " " + Path("out"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("11 images and " + Path("out/data.lst")));
  std::vector<std::string> lines = Split(ReadAll(Path("out/data.lst")), '\n');
  ASSERT_EQ(lines.size(), expected_.size());
  for (size_t i = 0; i < expected_.size(); ++i) {
    const Expected& e = expected_[i];
    const std::string name = StrCat(e.id, e.format == "png" ? ".png" : ".jpg");
    EXPECT_EQ(ReadAll(Path("out/" + name)), ReadAll(Path("images/" + e.file))) << name;
    const std::vector<std::string> fields = Split(lines[i], '\t');
    ASSERT_EQ(fields.size(), e.labels.size() + 2) << lines[i];
    EXPECT_EQ(fields[0], std::to_string(e.id));
    for (size_t k = 0; k < e.labels.size(); ++k) {
      EXPECT_EQ(std::strtof(fields[k + 1].c_str(), nullptr), e.labels[k]) << lines[i];
    }
    EXPECT_EQ(fields.back(), name);
  }
  EXPECT_EQ(lines[0], "1000\t3.000000\t1000.jpg");

  // MXNet's round trip: the .lst and images pack into the very same file.
  ASSERT_EQ(RunPstrain("im2rec --pass-through --pack-label " + Path("out/data") + " " + Path("out"),
                       &out),
            0)
      << out;
  EXPECT_TRUE(ReadAll(Path("out/data.rec")) == ReadAll(Path("data.rec")))
      << "the re-packed .rec differs from the original";
  EXPECT_EQ(ReadAll(Path("out/data.idx")), ReadAll(Path("data.idx")));

  EXPECT_EQ(RunPstrain("rec unpack " + Path("data.rec") + " " + Path("out"), &out), 1);
  EXPECT_THAT(out, HasSubstr("already holds files (pass --force"));
  EXPECT_EQ(RunPstrain("rec unpack --force " + Path("data.rec") + " " + Path("out"), &out), 0)
      << out;
}

TEST_F(RecCommandTest, IndexRebuildsTheWritersIdx) {
  fs::copy_file(Path("data.rec"), Path("lost.rec"));
  std::string out;
  ASSERT_EQ(RunPstrain("rec index " + Path("lost.rec"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("11 entries (key: id) written to " + Path("lost.idx")));
  EXPECT_EQ(ReadAll(Path("lost.idx")), ReadAll(Path("data.idx")));

  EXPECT_EQ(RunPstrain("rec index " + Path("lost.rec"), &out), 1);
  EXPECT_THAT(out, HasSubstr(Path("lost.idx") + " exists; pass --force"));
  // --force replaces the index, never rewrites it in place (an interruption
  // left a short one): a reader that opened the old one still reads it whole.
  const std::string old_index = ReadAll(Path("lost.idx"));
  std::ifstream reader(Path("lost.idx"), std::ios::binary);
  ASSERT_TRUE(reader.good());
  ASSERT_EQ(RunPstrain("rec index --force --key position " + Path("lost.rec"), &out), 0) << out;
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(reader), {}), old_index);
  EXPECT_FALSE(fs::exists(Path("lost.idx.part")));
  std::string by_position;
  for (const Expected& e : expected_) by_position += StrCat(e.index, "\t", e.offset, "\n");
  EXPECT_EQ(ReadAll(Path("lost.idx")), by_position);
  ASSERT_EQ(RunPstrain("rec index " + Path("lost.rec") + " " + Path("other.idx"), &out), 0) << out;
  EXPECT_EQ(ReadAll(Path("other.idx")), ReadAll(Path("data.idx")));
  EXPECT_EQ(RunPstrain("rec index --key name " + Path("lost.rec"), &out), 2);
}

// `rec cifar10` packs binary batches on disk (whole or cut at a record
// boundary, as ../shared/data/cifar10_partial) into lossless train/test pairs.
TEST_F(RecCommandTest, Cifar10PacksBinaryBatchesLosslessly) {
  const std::string dir = Path("cifar");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  // Record i: label, then constant R, G and B planes.
  auto record = [](int label, uint8_t r, uint8_t g, uint8_t b) {
    std::string rec(1, static_cast<char>(label));
    for (uint8_t v : {r, g, b}) rec.append(1024, static_cast<char>(v));
    return rec;
  };
  WriteAll(dir + "/data_batch_1.first2.bin", record(0, 1, 2, 3) + record(7, 40, 50, 60));
  WriteAll(dir + "/data_batch_2.bin", record(9, 255, 0, 128));
  WriteAll(dir + "/test_batch.bin", record(4, 9, 8, 7));
  std::string out;
  ASSERT_EQ(RunPstrain("rec cifar10 " + dir + " " + Path("packed"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("train.rec (3 images)"));
  EXPECT_THAT(out, HasSubstr("test.rec (1 images)"));
  ASSERT_EQ(RunPstrainStdout("rec ls " + Path("packed/train.rec"), &out), 0) << out;
  std::vector<std::vector<std::string>> rows = LsRows(out);
  ASSERT_EQ(rows.size(), 3u) << out;
  const char* labels[] = {"0", "7", "9"};
  const char* means[] = {"1.00,2.00,3.00", "40.00,50.00,60.00", "255.00,0.00,128.00"};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(std::strtof(rows[i][3].c_str(), nullptr), std::strtof(labels[i], nullptr));
    EXPECT_EQ(rows[i][5], "32x32x3");
    EXPECT_EQ(rows[i][6], means[i]) << "record " << i;
  }
  ASSERT_EQ(RunPstrain("rec check " + Path("packed/test.rec"), &out), 0) << out;
  // Kept when complete; a batch cut inside a record is an error naming it.
  ASSERT_EQ(RunPstrain("rec cifar10 " + dir + " " + Path("packed"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("already there"));
  WriteAll(dir + "/data_batch_3.bin", record(1, 0, 0, 0).substr(0, 100));
  EXPECT_EQ(RunPstrain("rec cifar10 --force " + dir + " " + Path("packed"), &out), 1);
  EXPECT_THAT(out, HasSubstr("data_batch_3.bin"));
  EXPECT_EQ(RunPstrain("rec cifar10 " + Path("none") + " " + Path("packed"), &out), 1);
  EXPECT_THAT(out, HasSubstr("none: cannot list"));
  ASSERT_EQ(mkdir(Path("empty").c_str(), 0755), 0);
  EXPECT_EQ(RunPstrain("rec cifar10 " + Path("empty") + " " + Path("packed"), &out), 1);
  EXPECT_THAT(out, HasSubstr("no CIFAR-10 data_batch_*.bin files in"));
  EXPECT_EQ(RunPstrain("rec cifar10 " + dir, &out), 2);
}

TEST_F(RecCommandTest, CheckPassesTheWritersFileAndIndex) {
  std::string out;
  ASSERT_EQ(RunPstrain("rec check " + Path("data.rec"), &out), 0) << out;
  EXPECT_THAT(out, HasSubstr(StrCat("records: 11 (0 bad); bytes: ", file_bytes_, " in the file")));
  EXPECT_THAT(out, HasSubstr("records split into pieces: 4\n"));
  EXPECT_THAT(out, HasSubstr("formats: jpeg 7 png 4\n"));
  EXPECT_THAT(out, HasSubstr("labels per record: 1 (8) 2 (1) 3 (2)\n"));
  EXPECT_THAT(out, HasSubstr("image sizes: 11 distinct, width 8..100, height 7..75"));
  EXPECT_THAT(out, HasSubstr("index: " + Path("data.idx") + ": 11 entries"));
  EXPECT_THAT(out, HasSubstr("check: OK"));

  // MXNet's ImageRecordIter wants label_width labels in every record.
  EXPECT_EQ(RunPstrain("rec check --no-idx --label-width 1 " + Path("data.rec"), &out), 1);
  for (int i : {2, 4, 6}) {
    EXPECT_THAT(out, HasSubstr(StrCat("bad record ", i, " at byte ", expected_[i].offset,
                                      " (label count)")));
  }
  EXPECT_THAT(out, HasSubstr("records: 11 (3 bad)"));

  // An index whose entry points into the middle of a record.
  std::string idx = ReadAll(Path("data.idx"));
  const std::string line = StrCat(expected_[5].id, "\t", expected_[5].offset, "\n");
  idx.replace(idx.find(line), line.size(),
              StrCat(expected_[5].id, "\t", expected_[5].offset + 8, "\n"));
  WriteAll(Path("shifted.idx"), idx);
  EXPECT_EQ(RunPstrain("rec check --idx " + Path("shifted.idx") + " " + Path("data.rec"), &out), 1);
  EXPECT_THAT(out, HasSubstr(StrCat("index problem: ", Path("shifted.idx"), ": entry 5 (key ",
                                    expected_[5].id, "): byte ", expected_[5].offset + 8,
                                    " is not the start of a readable record")));
  EXPECT_THAT(out, HasSubstr("records: 11 (0 bad)"));
  EXPECT_THAT(out, HasSubstr("the index does not match"));
}

TEST_F(RecCommandTest, CheckNamesEveryDamagedRecordByIndexAndOffset) {
  // Record 1: a JPEG that is garbage after its SOI and JFIF APP0 segments (20
  // bytes); record 3: a flipped magic word; record 10: the file ends inside it.
  std::string bytes = ReadAll(Path("data.rec"));
  const Expected& garbled = expected_[1];
  ASSERT_GT(garbled.image_offset, 0);
  ASSERT_EQ(bytes.substr(garbled.image_offset + 6, 4), "JFIF");
  std::fill_n(bytes.begin() + garbled.image_offset + 20, garbled.bytes - 20, '\x5a');
  bytes[expected_[3].offset] ^= 0xFF;
  bytes.resize(expected_[10].offset + 8 + 24 + 10);
  WriteAll(Path("bad.rec"), bytes);

  std::string out;
  ASSERT_EQ(RunPstrain("rec check --threads 2 " + Path("bad.rec"), &out), 1) << out;
  EXPECT_THAT(out, HasSubstr(StrCat("bad record 1 at byte ", expected_[1].offset, " (image): ",
                                    Path("bad.rec"), ":", expected_[1].offset, ": JPEG")));
  EXPECT_THAT(out, HasSubstr(StrCat("bad record 3 at byte ", expected_[3].offset,
                                    " (framing): ", Path("bad.rec"), ":", expected_[3].offset,
                                    ": bad RecordIO magic")));
  EXPECT_THAT(out, HasSubstr(StrCat("bad record 10 at byte ", expected_[10].offset,
                                    " (framing): ", Path("bad.rec"), ":", expected_[10].offset,
                                    ": truncated record")));
  EXPECT_THAT(out, HasSubstr("records: 11 (3 bad)"));
  EXPECT_THAT(out, HasSubstr("bad records by problem: framing 2 image 1"));
  EXPECT_THAT(out, HasSubstr("check: FAILED: 3 bad record(s)"));
  EXPECT_THAT(out, Not(HasSubstr("bad record 4")));

  // ls lists the others at their own positions and names the bad ones on stderr.
  ASSERT_EQ(RunPstrainStdout("rec ls " + Path("bad.rec"), &out), 1);
  auto rows = LsRows(out);
  ASSERT_EQ(rows.size(), 8u) << out;
  size_t row = 0;
  for (size_t i = 0; i < expected_.size(); ++i) {
    if (i == 1 || i == 3 || i == 10) continue;
    ExpectRowMatches(rows[row++], expected_[i], true);
  }
  ASSERT_EQ(RunPstrain("rec ls " + Path("bad.rec"), &out), 1);
  EXPECT_THAT(out, HasSubstr(StrCat("bad record 3 at byte ", expected_[3].offset)));
  EXPECT_THAT(out, HasSubstr("3 bad record(s) in " + Path("bad.rec")));

  // index refuses a damaged file (the garbled JPEG does not matter to it);
  // unpack skips the damaged records and says so.
  EXPECT_EQ(RunPstrain("rec index " + Path("bad.rec"), &out), 1);
  EXPECT_THAT(out, HasSubstr(StrCat("record 3 at byte ", expected_[3].offset, " is damaged")));
  EXPECT_FALSE(fs::exists(Path("bad.idx")));
  EXPECT_EQ(RunPstrain("rec unpack " + Path("bad.rec") + " " + Path("out"), &out), 1);
  EXPECT_THAT(
      out, HasSubstr("9 images and " + Path("out/bad.lst") + " written, 2 bad record(s) skipped"));
}

// Found by a review: a NaN label (a damaged record's) broke the ordered map
// of label values (every later label matched it) and pinned min and max.
TEST_F(RecToolsTest, NanLabelsAreCountedApartFromTheValues) {
  RecordFileSummary summary(1000);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float l : {nan, 1.0f, 2.0f, 3.0f, 1.0f, 2.0f, nan}) {
    ScannedRecord r;
    r.record.labels = {l};
    summary.Add(r);
  }
  EXPECT_EQ(summary.nan_labels(), 2);
  const std::map<float, int64_t> want = {{1.0f, 2}, {2.0f, 2}, {3.0f, 1}};
  EXPECT_EQ(summary.label_values(), want);
  const std::string text = summary.ToString();
  EXPECT_THAT(text, HasSubstr("label values: 3 distinct in [1, 3]: 1 (2) 2 (2) 3 (1)\n"));
  EXPECT_THAT(text, HasSubstr("labels that are not a number (nan): 2\n"));

  RecordFileSummary only_nan(1000);
  ScannedRecord r;
  r.record.labels = {nan};
  only_nan.Add(r);
  EXPECT_THAT(only_nan.ToString(), Not(HasSubstr("label values")));
  EXPECT_THAT(only_nan.ToString(), HasSubstr("(nan): 1"));
}

}  // namespace
}  // namespace pstrain
