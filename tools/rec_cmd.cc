// `pstrain rec ls|unpack|index|check|cifar10`: look into, take apart,
// re-index and verify RecordIO image files (data/rec_tools.h does the work),
// and pack CIFAR-10 binary batches that are already on disk. The command
// parses its own arguments because each subcommand has its own options.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "data/cifar10_rec.h"
#include "data/rec_tools.h"
#include "data/recordio.h"
#include "tools/commands.h"

namespace pstrain {
namespace {

constexpr char kUsage[] =
    "usage: pstrain rec <subcommand> [options] FILE ...\n"
    "\n"
    "  ls FILE [--no-decode] [--threads N]\n"
    "      one line per record: index, byte offset, id, labels, image bytes,\n"
    "      WxHxC, mean of each channel after decoding (--no-decode: '-', faster)\n"
    "  unpack FILE DIR [--force]\n"
    "      the images, bytes unchanged, as DIR/<id>.jpg|.png, and DIR/<name>.lst\n"
    "      (index, labels, path); pack them again with\n"
    "      `pstrain im2rec --pass-through --pack-label DIR/<name> DIR`\n"
    "  index FILE [IDX] [--force] [--key id|position]\n"
    "      rebuild the .idx (default: FILE with .rec replaced by .idx); keys are\n"
    "      record ids as im2rec writes them, or positions as MXNet's rec2idx.py\n"
    "  check FILE [--idx IDX | --no-idx] [--label-width N] [--threads N]\n"
    "      decode every record; print every bad record (index, byte offset, what\n"
    "      is wrong) and a summary; exit 1 if any record or the .idx is bad\n"
    "  cifar10 DIR OUT [--force]\n"
    "      pack the CIFAR-10 binary batches of DIR (data_batch_*.bin, test_batch*.bin,\n"
    "      whole or cut at a record boundary) into OUT/train.rec|.idx and\n"
    "      OUT/test.rec|.idx, each image a PNG (lossless), batches in name order;\n"
    "      complete pairs are kept unless --force\n"
    "\n"
    "--threads defaults to the number of CPUs (at most 8).\n";

int Usage(const std::string& error) {
  std::fprintf(stderr, "pstrain rec: %s\n\n%s", error.c_str(), kUsage);
  return 2;
}

int Fail(const char* sub, const Status& s) {
  std::fprintf(stderr, "pstrain rec %s: %s\n", sub, s.ToString().c_str());
  return 1;
}

// The positional arguments and --options of one subcommand.
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // name (dashes) -> value ("" for switches)

  bool Has(const std::string& name) const { return options.count(name) != 0; }
  std::string Get(const std::string& name, const std::string& def) const {
    auto it = options.find(name);
    return it == options.end() ? def : it->second;
  }
};

// Splits argv into positional arguments and options: switches take no value,
// `valued` options take "--name=V" or "--name V". Underscores in names read as
// dashes. Returns an error message, or "" on success.
std::string ParseArgs(const std::vector<std::string>& argv,
                      const std::vector<std::string>& switches,
                      const std::vector<std::string>& valued, Args* out) {
  auto known = [](const std::vector<std::string>& names, const std::string& n) {
    for (const std::string& k : names) {
      if (k == n) return true;
    }
    return false;
  };
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.size() < 3 || a.compare(0, 2, "--") != 0) {
      out->positional.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    for (char& c : name) {
      if (c == '_') c = '-';
    }
    if (known(switches, name)) {
      if (has_value) return "--" + name + " takes no value";
      out->options[name] = "";
    } else if (known(valued, name)) {
      if (!has_value) {
        if (i + 1 >= argv.size()) return "--" + name + " needs a value";
        value = argv[++i];
      }
      out->options[name] = value;
    } else {
      return "unknown option " + a;
    }
  }
  return "";
}

// A whole number in [lo, hi] from --name, or an error message.
std::string ParseInt(const Args& args, const std::string& name, int lo, int hi, int* out) {
  if (!args.Has(name)) return "";
  const std::string v = args.Get(name, "");
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || n < lo || n > hi) {
    return StrCat("--", name, " wants a whole number in [", lo, ", ", hi, "], got '", v, "'");
  }
  *out = static_cast<int>(n);
  return "";
}

int DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(std::min(n, 8u));
}

std::string Join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : sep) + parts[i];
  return out;
}

// FILE with a final .rec replaced by .idx (appended when there is none).
std::string DefaultIndexPath(const std::string& rec) {
  if (rec.size() > 4 && rec.compare(rec.size() - 4, 4, ".rec") == 0) {
    return rec.substr(0, rec.size() - 4) + ".idx";
  }
  return rec + ".idx";
}

void PrintBad(std::FILE* out, const ScannedRecord& r) {
  std::fprintf(out, "bad record %lld at byte %llu (%s): %s\n", static_cast<long long>(r.index),
               static_cast<unsigned long long>(r.offset), RecordProblemName(r.problem),
               r.status.message().c_str());
}

int RunLs(const std::vector<std::string>& argv) {
  Args args;
  std::string err = ParseArgs(argv, {"no-decode"}, {"threads"}, &args);
  int threads = DefaultThreads();
  if (err.empty()) err = ParseInt(args, "threads", 1, 256, &threads);
  if (err.empty() && args.positional.size() != 1) err = "ls wants one FILE";
  if (!err.empty()) return Usage(err);
  auto file = RecordIOFile::Open(args.positional[0]);
  if (!file.ok()) return Fail("ls", file.status());
  (*file)->AdviseSequential();
  ScanOptions opts;
  opts.depth = args.Has("no-decode") ? RecordScanDepth::kImageHeader : RecordScanDepth::kDecode;
  opts.num_threads = threads;
  int64_t bad = 0;
  std::printf("# index\toffset\tid\tlabels\tbytes\timage\tmeans\n");
  Status s = ScanImageRecords(**file, opts, [&](const ScannedRecord& r) -> Status {
    if (!r.ok()) {
      ++bad;
      std::fflush(stdout);
      PrintBad(stderr, r);
      return Status::Ok();
    }
    std::vector<std::string> labels, means;
    for (float l : r.record.labels) labels.push_back(FormatLabel(l));
    for (double m : r.channel_means) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.2f", m);
      means.push_back(buf);
    }
    std::printf("%lld\t%llu\t%llu\t%s\t%zu\t%dx%dx%d\t%s\n", static_cast<long long>(r.index),
                static_cast<unsigned long long>(r.offset),
                static_cast<unsigned long long>(r.record.header.id), Join(labels, ",").c_str(),
                r.record.image.size(), r.image.width, r.image.height, r.image.channels,
                means.empty() ? "-" : Join(means, ",").c_str());
    return Status::Ok();
  });
  std::fflush(stdout);
  if (!s.ok()) return Fail("ls", s);
  if (bad > 0) {
    std::fprintf(stderr, "pstrain rec ls: %lld bad record(s) in %s\n", static_cast<long long>(bad),
                 args.positional[0].c_str());
    return 1;
  }
  return 0;
}

int RunUnpack(const std::vector<std::string>& argv) {
  Args args;
  std::string err = ParseArgs(argv, {"force"}, {}, &args);
  if (err.empty() && args.positional.size() != 2) err = "unpack wants FILE and DIR";
  if (!err.empty()) return Usage(err);
  auto file = RecordIOFile::Open(args.positional[0]);
  if (!file.ok()) return Fail("unpack", file.status());
  (*file)->AdviseSequential();
  UnpackOptions opts;
  opts.force = args.Has("force");
  UnpackStats stats;
  Status s = UnpackRecordFile(
      **file, args.positional[1], opts, [](const ScannedRecord& r) { PrintBad(stderr, r); },
      &stats);
  if (!s.ok()) return Fail("unpack", s);
  std::printf("rec unpack: %lld images and %s written, %lld bad record(s) skipped\n",
              static_cast<long long>(stats.written), stats.list_path.c_str(),
              static_cast<long long>(stats.bad));
  if (stats.not_repackable > 0) {
    std::printf(
        "rec unpack: %lld record(s) have a header im2rec does not write (one label as a list, "
        "a header label beside a list, or a non-zero id2): packing again changes them\n",
        static_cast<long long>(stats.not_repackable));
  }
  return stats.bad > 0 ? 1 : 0;
}

int RunIndex(const std::vector<std::string>& argv) {
  Args args;
  std::string err = ParseArgs(argv, {"force"}, {"key"}, &args);
  const std::string key = args.Get("key", "id");
  if (err.empty() && key != "id" && key != "position") {
    err = "--key is id or position, not '" + key + "'";
  }
  if (err.empty() && (args.positional.empty() || args.positional.size() > 2)) {
    err = "index wants FILE [IDX]";
  }
  if (!err.empty()) return Usage(err);
  const std::string& rec = args.positional[0];
  const std::string idx = args.positional.size() == 2 ? args.positional[1] : DefaultIndexPath(rec);
  std::error_code ec;
  if (!args.Has("force") && std::filesystem::exists(idx, ec)) {
    return Fail("index",
                Status::FailedPrecondition(StrCat(idx, " exists; pass --force to overwrite it")));
  }
  auto file = RecordIOFile::Open(rec);
  if (!file.ok()) return Fail("index", file.status());
  (*file)->AdviseSequential();
  auto entries = BuildRecordIndex(**file, key == "id" ? IndexKey::kId : IndexKey::kPosition);
  if (!entries.ok()) return Fail("index", entries.status());
  // Written beside it and put in place: an interrupted run never leaves a
  // short index (readers would silently see fewer records).
  const std::string part = idx + ".part";
  Status s = WriteRecordIndex(part, *entries);
  if (s.ok() && std::rename(part.c_str(), idx.c_str()) != 0) {
    s = Status::IOError(StrCat("cannot rename ", part, " to ", idx, ": ", std::strerror(errno)));
  }
  if (!s.ok()) {
    std::remove(part.c_str());
    return Fail("index", s);
  }
  std::printf("rec index: %zu entries (key: %s) written to %s\n", entries->size(), key.c_str(),
              idx.c_str());
  return 0;
}

int RunCheck(const std::vector<std::string>& argv) {
  Args args;
  std::string err = ParseArgs(argv, {"no-idx"}, {"idx", "label-width", "threads"}, &args);
  int threads = DefaultThreads(), label_width = 0;
  if (err.empty()) err = ParseInt(args, "threads", 1, 256, &threads);
  if (err.empty()) err = ParseInt(args, "label-width", 0, 1 << 20, &label_width);
  if (err.empty() && args.Has("idx") && args.Has("no-idx")) err = "--idx and --no-idx exclude";
  if (err.empty() && args.positional.size() != 1) err = "check wants one FILE";
  if (!err.empty()) return Usage(err);
  const std::string& rec = args.positional[0];
  auto file = RecordIOFile::Open(rec);
  if (!file.ok()) return Fail("check", file.status());
  (*file)->AdviseSequential();
  std::string idx;
  std::error_code ec;
  if (args.Has("idx")) {
    idx = args.Get("idx", "");
  } else if (!args.Has("no-idx") && std::filesystem::exists(DefaultIndexPath(rec), ec)) {
    idx = DefaultIndexPath(rec);
  }
  ScanOptions opts;
  opts.depth = RecordScanDepth::kDecode;
  opts.num_threads = threads;
  opts.label_width = label_width;
  RecordFileSummary summary((*file)->size());
  std::vector<RecordStart> starts;
  Status s = ScanImageRecords(**file, opts, [&](const ScannedRecord& r) -> Status {
    summary.Add(r);
    if (!r.ok()) PrintBad(stdout, r);
    if (r.pieces > 0) starts.push_back(RecordStart{r.offset, r.record.header.id, r.index});
    return Status::Ok();
  });
  if (!s.ok()) return Fail("check", s);
  std::printf("%s: ", rec.c_str());
  std::fputs(summary.ToString().c_str(), stdout);
  size_t index_problems = 0;
  if (!idx.empty()) {
    auto entries = ReadRecordIndex(idx);
    if (!entries.ok()) {
      std::printf("index: %s\n", entries.status().ToString().c_str());
      index_problems = 1;
    } else {
      std::vector<std::string> problems = CompareRecordIndex(idx, *entries, starts);
      index_problems = problems.size();
      for (const std::string& p : problems) std::printf("index problem: %s\n", p.c_str());
      if (problems.empty()) {
        std::printf("index: %s: %zu entries, every one at a record start with its key\n",
                    idx.c_str(), entries->size());
      }
    }
  }
  if (summary.bad() > 0 || index_problems > 0) {
    std::printf("check: FAILED: %lld bad record(s)%s\n", static_cast<long long>(summary.bad()),
                index_problems > 0 ? ", the index does not match" : "");
    return 1;
  }
  std::printf("check: OK\n");
  return 0;
}

int RunCifar10(const std::vector<std::string>& argv) {
  Args args;
  std::string err = ParseArgs(argv, {"force"}, {}, &args);
  if (err.empty() && args.positional.size() != 2) err = "cifar10 wants DIR and OUT";
  if (!err.empty()) return Usage(err);
  std::string out = args.positional[1];
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return Fail("cifar10", Status::IOError(StrCat(out, ": cannot create: ", ec.message())));
  Cifar10RecStats stats;
  Status s = WriteCifar10RecordIO(args.positional[0], out, args.Has("force"), &stats);
  if (!s.ok()) return Fail("cifar10", s);
  std::printf("rec cifar10: %s/train.rec (%lld images), %s/test.rec (%lld images)%s\n", out.c_str(),
              static_cast<long long>(stats.train_records), out.c_str(),
              static_cast<long long>(stats.test_records),
              stats.already_there ? ", already there" : ", PNG");
  return 0;
}

}  // namespace

int RunRec(int argc, char** argv) {
  if (argc < 2) return Usage("which subcommand?");
  const std::string sub = argv[1];
  if (sub == "--help" || sub == "-h" || sub == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::vector<std::string> rest(argv + 2, argv + argc);
  for (const std::string& a : rest) {
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (sub == "ls") return RunLs(rest);
  if (sub == "unpack") return RunUnpack(rest);
  if (sub == "index") return RunIndex(rest);
  if (sub == "check") return RunCheck(rest);
  if (sub == "cifar10") return RunCifar10(rest);
  return Usage("unknown subcommand '" + sub + "'");
}

}  // namespace pstrain
