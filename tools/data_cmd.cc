// pstrain data: fetch data sets from their public mirrors (checked by SHA-256,
// resumed, unpacked), find the folder that holds one, list the built-in ones.
// Parses its own arguments (raw_args): --mirror may be repeated.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/env.h"
#include "data/cifar10_rec.h"
#include "data/dataset_get.h"
#include "data/dataset_manifest.h"
#include "tools/commands.h"

namespace pstrain {
namespace {

constexpr char kUsage[] =
    "usage: pstrain data <action> ...\n"
    "\n"
    "  get NAME [--dir D] [--rec]   fetch data set NAME into D (default $PSTRAIN_DATA/NAME, else\n"
    "                               datasets/NAME): every file checked by its SHA-256, a broken\n"
    "                               download resumed, archives unpacked; files already there\n"
    "                               with the right digest are kept\n"
    "  locate NAME [--no-download]  print the folder that holds NAME: $PSTRAIN_MNIST_DIR (mnist),\n"
    "                               $PSTRAIN_DATA/NAME, datasets/NAME, ../shared/data/NAME;\n"
    "                               when none does, fetch it as `get` does (progress on stderr)\n"
    "  list                         the built-in data sets\n"
    "  manifest NAME                print a built-in manifest (a start for --manifest files)\n"
    "\n"
    "NAME is mnist or cifar10, or left out with --manifest FILE (proto/dataset.proto).\n"
    "options:\n"
    "  --dir D               the folder (get)\n"
    "  --manifest FILE       the data set's files, digests and mirrors from FILE\n"
    "  --mirror URL          try URL instead of the manifest's mirrors; repeat for more, tried\n"
    "                        in order (http://, https://, file://; {name} stands for NAME).\n"
    "                        Default: $PSTRAIN_DATA_MIRRORS (comma separated), else the "
    "manifest's\n"
    "  --rec                 cifar10: also write train.rec/.idx and test.rec/.idx (PNG images,\n"
    "                        lossless) for the image pipeline (train --data-train D/train.rec)\n"
    "  --force-rec           rewrite the .rec files even if complete\n"
    "  --connect-timeout S   give up on a connection not open after S seconds (20)\n"
    "  --stall-timeout S     abandon a transfer below 1 kB/s for S seconds, then resume it (30)\n"
    "  --progress MODE       auto (a live line on a terminal, else a line per file), live, lines\n"
    "\n"
    "Proxies: https_proxy, http_proxy and no_proxy are honoured.\n"
    "examples:\n"
    "  pstrain data get mnist\n"
    "  pstrain data get cifar10 --dir /data/cifar10 --rec\n"
    "  pstrain data get mnist --mirror file:///media/usb/mnist/\n"
    "  pstrain train --network lenet --kv-store local --dataset mnist\n";

struct Args {
  std::string action;
  std::string name;
  std::string dir;
  std::string manifest;
  std::vector<std::string> mirrors;
  bool rec = false;
  bool force_rec = false;
  bool no_download = false;
  double connect_timeout = 20;
  double stall_timeout = 30;
  std::string progress = "auto";
  bool help = false;
};

StatusOr<double> ParseSeconds(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || !(v > 0) || v > 86400) {
    return Status::InvalidArgument(
        StrCat(flag, " '", value, "' must be a number of seconds in (0, 86400]"));
  }
  return v;
}

// A switch: on alone, or --name=true/false (1/0).
StatusOr<bool> Switch(const std::string& name, bool has_value, const std::string& value) {
  if (!has_value || value == "true" || value == "1") return true;
  if (value == "false" || value == "0") return false;
  return Status::InvalidArgument(StrCat(name, "='", value, "': a switch is true or false"));
}

StatusOr<Args> ParseArgs(int argc, char** argv) {
  Args a;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const bool has_eq = arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos;
    if (has_eq) {
      value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
    }
    auto take = [&]() -> StatusOr<std::string> {
      if (has_eq) return value;
      if (i + 1 >= argc) return Status::InvalidArgument(StrCat(arg, " needs a value"));
      return std::string(argv[++i]);
    };
    if (arg == "-h" || arg == "--help") {
      a.help = true;
    } else if (arg == "--dir") {
      ASSIGN_OR_RETURN(a.dir, take());
    } else if (arg == "--manifest") {
      ASSIGN_OR_RETURN(a.manifest, take());
    } else if (arg == "--mirror") {
      ASSIGN_OR_RETURN(std::string m, take());
      if (m.rfind("http://", 0) != 0 && m.rfind("https://", 0) != 0 && m.rfind("file://", 0) != 0) {
        return Status::InvalidArgument(
            StrCat("--mirror '", m, "' is not an http://, https:// or file:// URL"));
      }
      a.mirrors.push_back(m);
    } else if (arg == "--rec") {
      ASSIGN_OR_RETURN(a.rec, Switch(arg, has_eq, value));
    } else if (arg == "--force-rec") {
      ASSIGN_OR_RETURN(a.force_rec, Switch(arg, has_eq, value));
    } else if (arg == "--no-download") {
      ASSIGN_OR_RETURN(a.no_download, Switch(arg, has_eq, value));
    } else if (arg == "--connect-timeout") {
      ASSIGN_OR_RETURN(std::string v, take());
      ASSIGN_OR_RETURN(a.connect_timeout, ParseSeconds(arg, v));
    } else if (arg == "--stall-timeout") {
      ASSIGN_OR_RETURN(std::string v, take());
      ASSIGN_OR_RETURN(a.stall_timeout, ParseSeconds(arg, v));
    } else if (arg == "--progress") {
      ASSIGN_OR_RETURN(a.progress, take());
      if (a.progress != "auto" && a.progress != "live" && a.progress != "lines") {
        return Status::InvalidArgument(
            StrCat("--progress '", a.progress, "' is not auto, live or lines"));
      }
    } else if (arg.rfind("-", 0) == 0) {
      return Status::InvalidArgument(StrCat("unknown option ", arg));
    } else {
      positional.push_back(arg);
    }
  }
  if (a.help) return a;
  a.rec = a.rec || a.force_rec;
  if (positional.empty()) return Status::InvalidArgument("an action is required");
  a.action = positional[0];
  if (positional.size() > 2) {
    return Status::InvalidArgument(StrCat("unexpected argument '", positional[2], "'"));
  }
  if (positional.size() == 2) a.name = positional[1];
  return a;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "pstrain data: %s\n", s.ToString().c_str());
  return 1;
}

// A usage error (a name missing or unknown, an option the action does not
// take): exit 2, as every command's.
int UsageFail(const Status& s) {
  Fail(s);
  return 2;
}

// A manifest that could not be had: the arguments' fault (exit 2) when they
// name no file, or a file's (exit 1).
int ManifestFail(const Args& a, const Status& s) {
  return a.manifest.empty() ? UsageFail(s) : Fail(s);
}

// The manifest the arguments name; an error when they name none or two.
StatusOr<DatasetManifest> ManifestOf(const Args& a) {
  if (!a.manifest.empty()) {
    ASSIGN_OR_RETURN(DatasetManifest m, ReadManifestFile(a.manifest));
    if (!a.name.empty() && a.name != m.name()) {
      return Status::InvalidArgument(
          StrCat("data set '", a.name, "' but ", a.manifest, " describes '", m.name(), "'"));
    }
    return m;
  }
  if (a.name.empty()) {
    return Status::InvalidArgument(StrCat("`", a.action, "` needs a data set name or --manifest"));
  }
  return BuiltinManifest(a.name);
}

int RunGetOrLocate(const Args& a, const DataEnv& env) {
  auto manifest = ManifestOf(a);
  if (!manifest.ok()) return ManifestFail(a, manifest.status());
  const bool live = a.progress == "live" || (a.progress == "auto" && isatty(STDERR_FILENO));
  std::unique_ptr<FetchProgress> progress = NewConsoleProgress(stderr, live);
  GetOptions options;
  options.fetch.connect_timeout_ms = static_cast<int64_t>(a.connect_timeout * 1000);
  options.fetch.low_speed_seconds = std::max<int64_t>(1, static_cast<int64_t>(a.stall_timeout));
  options.fetch.progress = progress.get();
  options.mirrors = a.mirrors.empty() ? env.mirrors : a.mirrors;

  std::string dir;
  if (a.action == "locate") {
    if (!a.dir.empty()) return UsageFail(Status::InvalidArgument("locate takes no --dir"));
    auto located = LocateDataset(*manifest, env, !a.no_download, options);
    if (!located.ok()) return Fail(located.status());
    dir = located->dir;
    if (located->origin != "fetched") {
      std::fprintf(stderr, "pstrain data: %s is in %s (%s)\n", manifest->name().c_str(),
                   dir.c_str(), located->origin.c_str());
    }
  } else {
    dir = a.dir.empty() ? DefaultDatasetDir(manifest->name(), env) : a.dir;
    GetReport report;
    Status s = GetDataset(*manifest, dir, options, &report);
    if (!s.ok()) return Fail(s);
    if (report.already_there) {
      std::fprintf(stderr, "pstrain data: %s is complete in %s (every file's SHA-256 checked)\n",
                   manifest->name().c_str(), dir.c_str());
    }
  }
  if (a.rec) {
    Cifar10RecStats stats;
    Status s = WriteCifar10RecordIO(dir, dir, a.force_rec, &stats);
    if (!s.ok()) return Fail(s.WithContext("--rec"));
    std::fprintf(stderr, "pstrain data: %s/train.rec (%lld images), %s/test.rec (%lld images)%s\n",
                 dir.c_str(), static_cast<long long>(stats.train_records), dir.c_str(),
                 static_cast<long long>(stats.test_records),
                 stats.already_there ? ", already there" : ", PNG");
  }
  if (a.action == "locate") std::printf("%s\n", dir.c_str());
  return 0;
}

}  // namespace

int RunData(int argc, char** argv) {
  auto parsed = ParseArgs(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "pstrain data: %s\n\n%s", parsed.status().message().c_str(), kUsage);
    return 2;
  }
  const Args& a = *parsed;
  if (a.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto env = ReadDataEnv(Environment());
  if (!env.ok()) return Fail(env.status());
  if (a.action == "list") {
    for (const std::string& name : BuiltinDatasets()) {
      auto m = BuiltinManifest(name);
      if (!m.ok()) return Fail(m.status());
      int64_t bytes = 0;
      for (const DatasetFile& f : m->file()) bytes += f.size();
      std::printf("%-8s %s; %s to fetch\n", name.c_str(), m->description().c_str(),
                  HumanBytes(static_cast<double>(bytes)).c_str());
    }
    return 0;
  }
  if (a.action == "manifest") {
    auto m = ManifestOf(a);
    if (!m.ok()) return ManifestFail(a, m.status());
    std::fputs(ManifestText(*m).c_str(), stdout);
    return 0;
  }
  if (a.action == "get" || a.action == "locate") return RunGetOrLocate(a, *env);
  std::fprintf(stderr, "pstrain data: unknown action '%s'\n\n%s", a.action.c_str(), kUsage);
  return 2;
}

}  // namespace pstrain
