// The subcommands of the `pstrain` binary. Each lives in tools/<name>_cmd.cc,
// defines its own gflags there, and is listed in kCommands (pstrain_main.cc).
#ifndef PSTRAIN_TOOLS_COMMANDS_H_
#define PSTRAIN_TOOLS_COMMANDS_H_

namespace pstrain {

// argv[0] is "pstrain <name>"; flags are already parsed and removed, so argv
// holds only the positional arguments. Returns the process exit code.
using CommandFn = int (*)(int argc, char** argv);

struct Command {
  const char* name;
  const char* summary;
  CommandFn run;
  // Source file(s) whose gflags belong to this command (for `pstrain <name> --help`),
  // separated by commas, e.g. "kvbench_cmd.cc,cluster_flags.cc".
  const char* flag_files;
  // When true the command parses its own arguments: argv holds everything after
  // the subcommand, untouched (no gflags, no dash mapping, `--help` included).
  bool raw_args = false;
  // False: the command takes flags only; a positional argument (a word it
  // would ignore, as "false" in `--verify false`) is a usage error.
  bool operands = true;
};

int RunVersion(int argc, char** argv);
// parameter server (tools/scheduler_cmd.cc, server_cmd.cc, kvbench_cmd.cc):
int RunSchedulerCmd(int argc, char** argv);
int RunKeygen(int argc, char** argv);
int RunServerCmd(int argc, char** argv);
int RunKvbench(int argc, char** argv);
// training (tools/train_cmd.cc, tools/summary_cmd.cc):
int RunSummary(int argc, char** argv);
int RunTrain(int argc, char** argv);
// model export (tools/export_cmd.cc):
int RunExport(int argc, char** argv);

// data sets (tools/data_cmd.cc):
int RunData(int argc, char** argv);
// image pipeline (tools/im2rec_cmd.cc, tools/imageio_cmd.cc, tools/rec_cmd.cc)
int RunIm2rec(int argc, char** argv);
int RunImageIo(int argc, char** argv);
int RunRec(int argc, char** argv);
// launchers and logs (tracker/, logtools/):
int RunLaunch(int argc, char** argv);
int RunParseLog(int argc, char** argv);
int RunTop(int argc, char** argv);

}  // namespace pstrain

#endif  // PSTRAIN_TOOLS_COMMANDS_H_
