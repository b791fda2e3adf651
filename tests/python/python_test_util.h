// Helpers for the tests that run the pstrain Python package (tests/python/*.py):
// the interpreter the module was built for, the environment that imports the
// build's module, and running a script (alone or under `pstrain launch`).
#ifndef PSTRAIN_TESTS_PYTHON_PYTHON_TEST_UTIL_H_
#define PSTRAIN_TESTS_PYTHON_PYTHON_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "common/env.h"
#include "tests/test_util.h"
#include "tracker/process.h"

namespace pstrain::testing {

// The interpreter CMake built the module for (Debian's /usr/bin/python3 when present).
inline std::string PythonExecutable() { return PSTRAIN_PYTHON_EXECUTABLE; }
// tests/python/<name>.
inline std::string PythonScript(const std::string& name) {
  return SourceDir() + "/tests/python/" + name;
}

// The environment of a process that imports the build's `pstrain` package:
// the caller's, with PYTHONPATH pointing at the build and no DMLC_* left over.
inline std::map<std::string, std::string> PythonEnv(std::map<std::string, std::string> extra = {}) {
  std::map<std::string, std::string> env = {{"PYTHONPATH", PSTRAIN_PYTHON_PATH},
                                            {"PYTHONDONTWRITEBYTECODE", "1"},
                                            {"DMLC_ROLE", ""},
                                            {"DMLC_PS_ROOT_URI", ""},
                                            {"DMLC_PS_ROOT_PORT", ""},
                                            {"DMLC_NUM_SERVER", ""},
                                            {"DMLC_NUM_WORKER", ""}};
  for (auto& [k, v] : extra) env[k] = v;
  return Environment(std::move(env)).All();
}

struct ScriptRun {
  int exit_code = -1;  // -1: killed or did not start
  std::string output;  // stdout and stderr together
};

// Runs argv to completion within timeout_ms with `env`.
inline ScriptRun RunWithEnv(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env, int timeout_ms) {
  ScriptRun run;
  int wait_status = 0;
  const Status s = tracker::RunAndCapture(argv, env, timeout_ms, &run.output, &wait_status);
  EXPECT_TRUE(s.ok()) << s << "\n" << run.output;
  if (s.ok() && WIFEXITED(wait_status)) run.exit_code = WEXITSTATUS(wait_status);
  return run;
}

// Whether `module` imports in the test interpreter (numpy, torch).
inline bool PythonHas(const std::string& module) {
  return RunWithEnv({PythonExecutable(), "-c", "import " + module}, PythonEnv(), 120000)
             .exit_code == 0;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_PYTHON_PYTHON_TEST_UTIL_H_
