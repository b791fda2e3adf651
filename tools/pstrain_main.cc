// pstrain: one binary with git-style subcommands. This file only parses the
// command line and dispatches; the work is in the libraries.
//
// Flags may be written MXNet-style with dashes (--num-epochs 3); they are
// mapped to gflags' underscores (--num_epochs) before parsing. A bare `--`
// ends the flags; everything after it reaches the command untouched.
#include <gflags/gflags.h>
#include <glog/logging.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"

namespace pstrain {
namespace {

// ---- the command table: keep sorted by name ----
// Each area adds its rows under its own comment (see docs/architecture.md).
const Command kCommands[] = {
    // launchers and logs (tracker/):
    {"launch", "start a job: scheduler, servers, workers (local, ssh, mpi, slurm)", RunLaunch, "",
     true},
    {"parse-log", "accuracy-per-epoch tables (and SVG plots) from training logs", RunParseLog,
     "parse_log_cmd.cc"},
    {"top", "live view of a job from its logs: one status line per process", RunTop, "top_cmd.cc"},

    // parameter server (scheduler/, server/, worker/):
    {"keygen", "write new keys for a job started by hand (PSTRAIN_KEY_FILE)", RunKeygen, "",
     /*raw_args=*/true},
    {"kvbench", "push/pull throughput of the parameter server (--verify: conformance check)",
     RunKvbench, "kvbench_cmd.cc,cluster_role.cc", /*raw_args=*/false, /*operands=*/false},
    {"scheduler", "run the scheduler of a job (DMLC_* variables)", RunSchedulerCmd,
     "cluster_role.cc", /*raw_args=*/false, /*operands=*/false},
    {"server", "run one parameter server of a job (DMLC_* variables)", RunServerCmd,
     "cluster_role.cc", /*raw_args=*/false, /*operands=*/false},

    // data sets (data/dataset_get.h):
    {"data", "fetch data sets (mnist, cifar10): checked, resumed; find the folder holding one",
     RunData, "", /*raw_args=*/true},

    // image pipeline (data/):
    {"im2rec", "make .lst files from image folders; pack them into RecordIO .rec + .idx", RunIm2rec,
     "im2rec_cmd.cc"},
    {"imageio", "read a .rec through the image pipeline and report images/s", RunImageIo,
     "imageio_cmd.cc,image_flags.cc", /*raw_args=*/false, /*operands=*/false},
    {"rec",
     "RecordIO files: ls, unpack (images + .lst), index (rebuild .idx), check, cifar10 (pack "
     "binary batches)",
     RunRec, "",
     /*raw_args=*/true},

    // training (nn/, models/, worker/):
    {"summary", "print a model's layers, output shapes and parameter counts", RunSummary,
     "fit_flags.cc", /*raw_args=*/false, /*operands=*/false},
    {"train", "train a network (MXNet fit.py flags; --config FILE)", RunTrain,
     "fit_flags.cc,image_flags.cc,cluster_role.cc", /*raw_args=*/false, /*operands=*/false},

    // model export (onnx/):
    {"export", "write a trained model as an ONNX file (--params, --out)", RunExport,
     "export_cmd.cc,fit_flags.cc", /*raw_args=*/false, /*operands=*/false},

    {"version", "print the version and build configuration", RunVersion, "", /*raw_args=*/false,
     /*operands=*/false},
};

const Command* FindCommand(const std::string& name) {
  for (const Command& c : kCommands) {
    if (name == c.name) return &c;
  }
  return nullptr;
}

void PrintTopUsage(FILE* out) {
  std::fprintf(out,
               "usage: pstrain <command> [--flag=value ...] [-- args]\n\n"
               "commands:\n");
  for (const Command& c : kCommands) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\n`pstrain <command> --help` lists a command's flags.\n"
               "Flags take MXNet's dashed names (--num-epochs); commands other than launch and\n"
               "data take underscores too (--num_epochs).\n");
}

bool FlagBelongsTo(const gflags::CommandLineFlagInfo& f, const char* files) {
  std::string list(files);
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string file =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!file.empty() && f.filename.size() >= file.size() &&
        f.filename.compare(f.filename.size() - file.size(), file.size(), file) == 0) {
      return true;
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return false;
}

// Whether `cmd` reads flag `f`: one its files define, or (the job config's
// RecordIO paths, image_flags.cc's) --data-train and --data-val where
// fit_flags.cc reads the config.
bool CommandTakes(const Command& cmd, const gflags::CommandLineFlagInfo& f) {
  if (FlagBelongsTo(f, cmd.flag_files)) return true;
  return std::string(cmd.flag_files).find("fit_flags.cc") != std::string::npos &&
         IsFitFlag(f.name, f.filename);
}

// The commands that take `f`, comma-separated; empty for a flag of no
// command (glog's, gflags' own).
std::string CommandsTaking(const gflags::CommandLineFlagInfo& f) {
  std::string names;
  for (const Command& c : kCommands) {
    if (c.raw_args || !CommandTakes(c, f)) continue;
    names += StrCat(names.empty() ? "" : ", ", c.name);
  }
  return names;
}

void PrintCommandHelp(const Command& cmd) {
  std::printf("pstrain %s: %s\n\nflags:\n", cmd.name, cmd.summary);
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (!FlagBelongsTo(f, cmd.flag_files)) continue;
    std::string name = f.name;
    for (char& ch : name) {
      if (ch == '_') ch = '-';
    }
    std::string def = f.default_value;
    if (f.type == "double" || f.type == "float") {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%g", std::strtod(def.c_str(), nullptr));
      def = buf;  // 0.05, not 0.050000000000000003
    }
    std::printf("  --%-24s %s (default: %s%s%s)\n", name.c_str(), f.description.c_str(),
                f.type == "string" ? "\"" : "", def.c_str(), f.type == "string" ? "\"" : "");
  }
  std::printf("\nlogging: --v=N for verbose logs, --logtostderr=0 --log_dir=DIR for files.\n");
}

// Makes `args` (args[0] is the program) what gflags parses, and returns what
// it would refuse in them (empty: nothing), checked here so that a usage
// error exits 2 with our message where gflags exits 1:
//   - "--num-epochs=3" -> "--num_epochs=3"; values and positional args are
//     left alone: the word after a flag that takes one ("--rgb-mean -1,-2,-3");
//   - MXNet's "--no-shuffle" for a boolean flag `shuffle` becomes gflags'
//     "--noshuffle" (unless a flag is itself named no_shuffle);
//   - refused: an unknown flag, another command's flag (the binary holds
//     every command's flags, but `cmd` would ignore it), a value gflags
//     cannot parse for the flag's type, a flag missing its value. Not checked
//     when --flagfile, --fromenv, --tryfromenv or --undefok is given (flags
//     from elsewhere, or unknown ones allowed): gflags then decides.
std::string NormalizeFlags(const Command& cmd, std::vector<std::string>* args) {
  // As the help spells flags.
  auto dashed = [](std::string name) {
    std::replace(name.begin(), name.end(), '_', '-');
    return "--" + name;
  };
  struct Given {
    std::string name;
    std::optional<std::string> value;  // none: a boolean's switch, or missing
  };
  std::vector<Given> given;
  std::string unknown;  // the first
  bool value_next = false;
  for (size_t i = 1; i < args->size(); ++i) {
    std::string& a = (*args)[i];
    if (a == "--") break;
    if (value_next) {
      value_next = false;
      given.back().value = a;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') continue;  // a positional argument
    const size_t name_start = a[1] == '-' ? 2 : 1;
    size_t name_end = a.find('=');
    if (name_end == std::string::npos) name_end = a.size();
    // (Not in a word such as "-1,-2": no flag; gflags refuses it as one.)
    if (std::isalpha(static_cast<unsigned char>(a[name_start]))) {
      std::replace(a.begin() + name_start, a.begin() + name_end, '-', '_');
    }
    std::string name = a.substr(name_start, name_end - name_start);
    std::optional<std::string> value;
    if (name_end < a.size()) value = a.substr(name_end + 1);
    gflags::CommandLineFlagInfo info;
    // Another command's flag (the binary holds them all): refused, not ignored.
    auto check_owner = [&](const std::string& written) {
      if (const std::string takers = CommandsTaking(info);
          !takers.empty() && !CommandTakes(cmd, info) && unknown.empty()) {
        unknown = StrCat("flag '", dashed(written), "' belongs to pstrain ", takers,
                         ", not to pstrain ", cmd.name);
      }
    };
    if (!gflags::GetCommandLineFlagInfo(name.c_str(), &info)) {
      const size_t no = name.rfind("no_", 0) == 0 ? 3 : name.rfind("no", 0) == 0 ? 2 : 0;
      if (no > 0 && gflags::GetCommandLineFlagInfo(name.substr(no).c_str(), &info) &&
          info.type == "bool") {
        // --no-shuffle, --noshuffle (gflags ignores a value given to it).
        check_owner(name);
        if (no == 3) a = a.substr(0, name_start) + "no" + a.substr(name_start + 3);
        continue;
      }
      if (unknown.empty()) unknown = StrCat("unknown command line flag '", dashed(name), "'");
      continue;
    }
    check_owner(name);
    given.push_back({name, value});
    value_next = !value.has_value() && info.type != "bool";
  }
  for (const Given& g : given) {
    for (const char* special : {"flagfile", "fromenv", "tryfromenv", "undefok"}) {
      if (g.name == special) return "";
    }
  }
  if (!unknown.empty()) return unknown;
  for (const Given& g : given) {
    gflags::CommandLineFlagInfo info;
    gflags::GetCommandLineFlagInfo(g.name.c_str(), &info);
    if (!g.value.has_value()) {
      if (info.type == "bool") continue;
      return StrCat("flag '", dashed(g.name), "' is missing its value");
    }
    // Parsed as gflags parses it (and set, as the parse then sets it again).
    if (gflags::SetCommandLineOption(g.name.c_str(), g.value->c_str()).empty()) {
      return StrCat("illegal value '", *g.value, "' for ", info.type, " flag '", dashed(g.name),
                    "'");
    }
  }
  return "";
}

}  // namespace
}  // namespace pstrain

int main(int argc, char** argv) {
  using pstrain::Command;
  // A node holds a few descriptors per peer (its socket, ZeroMQ's wake-ups,
  // the peer's connection to it): a large job's scheduler needs more than the
  // usual soft limit of 1024, up to what the hard limit allows.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = std::min<rlim_t>(files.rlim_max, 1 << 20);
    setrlimit(RLIMIT_NOFILE, &files);
  }
  if (argc < 2 || std::strcmp(argv[1], "help") == 0 || std::strcmp(argv[1], "--help") == 0 ||
      std::strcmp(argv[1], "-h") == 0) {
    const bool named = argc >= 3 && std::strcmp(argv[2], "--help") != 0 &&
                       std::strcmp(argv[2], "-h") != 0;  // `help --help`: the usage
    if (named && std::strcmp(argv[1], "help") == 0) {
      if (const Command* c = pstrain::FindCommand(argv[2])) {
        if (c->raw_args) {  // it prints its own help
          std::string name = std::string("pstrain ") + c->name;
          char help[] = "--help";
          char* raw[] = {name.data(), help, nullptr};
          return c->run(2, raw);
        }
        pstrain::PrintCommandHelp(*c);
        return 0;
      }
      std::fprintf(stderr, "pstrain: unknown command '%s'\n\n", argv[2]);
      pstrain::PrintTopUsage(stderr);
      return 2;
    }
    pstrain::PrintTopUsage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const Command* cmd = pstrain::FindCommand(argv[1]);
  if (cmd == nullptr) {
    std::fprintf(stderr, "pstrain: unknown command '%s'\n\n", argv[1]);
    pstrain::PrintTopUsage(stderr);
    return 2;
  }

  std::vector<std::string> args;
  args.push_back(std::string("pstrain ") + cmd->name);
  if (cmd->raw_args) {
    std::vector<char*> raw;
    raw.push_back(args[0].data());
    for (int i = 2; i < argc; ++i) raw.push_back(argv[i]);
    raw.push_back(nullptr);
    FLAGS_logtostderr = true;
    google::InitGoogleLogging(argv[0]);
    return cmd->run(static_cast<int>(raw.size()) - 1, raw.data());
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      for (; i < argc; ++i) args.push_back(argv[i]);
      break;
    }
    if (a == "--help" || a == "-help" || a == "-h") {
      pstrain::PrintCommandHelp(*cmd);
      return 0;
    }
    args.push_back(a);
  }
  if (const std::string error = pstrain::NormalizeFlags(*cmd, &args); !error.empty()) {
    std::fprintf(stderr, "pstrain %s: %s (see `pstrain %s --help`)\n", cmd->name, error.c_str(),
                 cmd->name);
    return 2;
  }

  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  int cargc = static_cast<int>(args.size());
  char** cargv_ptr = cargv.data();

  FLAGS_logtostderr = true;
  gflags::SetUsageMessage(std::string("see `pstrain ") + cmd->name + " --help`");
  gflags::ParseCommandLineFlags(&cargc, &cargv_ptr, /*remove_flags=*/true);
  if (!cmd->operands && cargc > 1) {
    const std::string word = cargv_ptr[1];
    const bool boolean_word = word == "true" || word == "false";
    std::fprintf(
        stderr,
        "pstrain %s: unexpected argument '%s' (it takes flags only%s; see `pstrain %s --help`)\n",
        cmd->name, word.c_str(),
        boolean_word ? ": a boolean flag takes its value as --flag=false" : "", cmd->name);
    return 2;
  }
  google::InitGoogleLogging(cargv_ptr[0]);
  return cmd->run(cargc, cargv_ptr);
}
