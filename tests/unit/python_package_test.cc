// The pstrain Python package without a cluster (tests/python/package_test.py):
// `import pstrain` on a worker and in a misconfigured server, the `local`
// KVStore and its optimizer against MXNet's rule, conversions and zero-copy
// use of PyTorch tensors, errors raised as Python exceptions.
#include <gtest/gtest.h>

#include "tests/python/python_test_util.h"

namespace pstrain {
namespace {

using testing::PythonEnv;
using testing::PythonExecutable;
using testing::PythonScript;
using testing::RunWithEnv;

TEST(PythonPackageTest, ImportRolesLocalStoreAndErrors) {
  if (!testing::PythonHas("numpy")) GTEST_SKIP() << PythonExecutable() << " has no numpy";
  auto run = RunWithEnv({PythonExecutable(), PythonScript("package_test.py")}, PythonEnv(), 120000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("package: roles ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("package: local store ok"), std::string::npos) << run.output;
  // A request that failed while nobody waited for it raises at the next
  // waitall, barrier or close.
  EXPECT_NE(run.output.find("package: lost errors ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("package: repeated keys ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("package: output sizes ok"), std::string::npos) << run.output;
  // A failed copy into the caller's array, several threads waiting, an error at exit.
  EXPECT_NE(run.output.find("package: settling ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("package: init values ok"), std::string::npos) << run.output;
  // A failed first configuration, an error at an interactive prompt.
  EXPECT_NE(run.output.find("package: store lifecycle ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("package: all ok"), std::string::npos) << run.output;
  if (testing::PythonHas("torch")) {
    EXPECT_NE(run.output.find("package: torch tensors ok"), std::string::npos) << run.output;
    EXPECT_NE(run.output.find("package: mnist example finds its data ok"), std::string::npos)
        << run.output;
  }
}

// NAG, Adam, RMSProp and AdaGrad in a local store against MXNet's rules in
// NumPy, their optimizer states saved and loaded, and
// pstrain.torch.server_optimizer against torch.optim
// (tests/python/optimizer_test.py).
TEST(PythonPackageTest, OptimizersFollowMXNetsRules) {
  if (!testing::PythonHas("numpy")) GTEST_SKIP() << PythonExecutable() << " has no numpy";
  auto run =
      RunWithEnv({PythonExecutable(), PythonScript("optimizer_test.py")}, PythonEnv(), 120000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("optimizers: classes, defaults and errors ok"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("optimizers: local rules ok"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("optimizers: states saved and loaded, every type"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("optimizers: another optimizer's state refused"), std::string::npos)
      << run.output;
  if (testing::PythonHas("torch")) {
    EXPECT_NE(run.output.find("optimizers: server_optimizer maps torch SGD, Adam, RMSprop, "
                              "Adagrad and refuses the rest ok"),
              std::string::npos)
        << run.output;
  }
  EXPECT_NE(run.output.find("optimizers: all ok"), std::string::npos) << run.output;
}

// `pip install .` builds the module with this tree's CMake (here the test's own
// build folder, PSTRAIN_BUILD_DIR, so nothing is compiled again) and installs a
// package that imports and works from where pip put it.
TEST(PythonPackageTest, PipInstallsAWorkingPackage) {
  if (!testing::PythonHas("numpy")) GTEST_SKIP() << PythonExecutable() << " has no numpy";
  if (RunWithEnv({PythonExecutable(), "-m", "pip", "--version"}, PythonEnv(), 60000).exit_code !=
      0) {
    GTEST_SKIP() << PythonExecutable() << " has no pip (Debian: python3-pip)";
  }
  testing::TempDir dir;
  const std::string target = dir.path() + "/site";
  auto pip = RunWithEnv({PythonExecutable(), "-m", "pip", "install", "--no-build-isolation",
                         "--no-deps", "--no-cache-dir", "--target", target, testing::SourceDir()},
                        PythonEnv({{"PSTRAIN_BUILD_DIR", PSTRAIN_CMAKE_BINARY_DIR}}), 300000);
  ASSERT_EQ(pip.exit_code, 0) << pip.output;
  const std::string check =
      "import numpy, pstrain\n"
      "assert pstrain.__file__.startswith('" +
      target + "/pstrain/'), pstrain.__file__\n" +
      "kv = pstrain.KVStore('local')\n"
      "kv.init('w', numpy.ones(3, numpy.float32))\n"
      "kv.set_optimizer(pstrain.optimizer.SGD(learning_rate=0.5))\n"
      "kv.push('w', numpy.ones(3, numpy.float32)).wait()\n"
      "out = numpy.zeros(3, numpy.float32)\n"
      "kv.pull('w', out=out).wait()\n"
      "print('installed package ok', out.tolist())\n";
  auto run =
      RunWithEnv({PythonExecutable(), "-c", check}, PythonEnv({{"PYTHONPATH", target}}), 60000);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("installed package ok [0.5, 0.5, 0.5]"), std::string::npos)
      << run.output;
}

// Runs `script` with bash in the source folder (setup.py's setuptools work there).
testing::ScriptRun InSourceDir(const std::string& script,
                               std::map<std::string, std::string> extra = {}) {
  return RunWithEnv({"bash", "-c", "cd '" + testing::SourceDir() + "' && " + script},
                    PythonEnv(std::move(extra)), 300000);
}

// `setup.py sdist` ships the C++ tree setup.py builds from: the unpacked sdist
// configures with CMake as setup.py configures it (it once held only the
// Python files).
TEST(PythonPackageTest, SdistConfiguresWithCMake) {
  testing::TempDir dir;
  const std::string d = "'" + dir.path() + "'";
  auto run = InSourceDir("'" + PythonExecutable() + "' setup.py -q egg_info --egg-base " + d +
                         " sdist --dist-dir " + d + " && tar xzf " + d + "/pstrain-*.tar.gz -C " +
                         d + " && cmake -S " + d + "/pstrain-*/ -B " + d +
                         "/b -DCMAKE_BUILD_TYPE=Release -DPSTRAIN_BUILD_TESTS=OFF "
                         "-DPSTRAIN_PYTHON=ON '-DPython3_EXECUTABLE=" +
                         PythonExecutable() + "'");
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("Generating done"), std::string::npos) << run.output;
}

// PSTRAIN_BUILD_DIR naming a build configured without the Python package: setup.py
// says so and how to fix it (the build failed on a missing target).
TEST(PythonPackageTest, SetupRefusesABuildWithoutThePythonPackage) {
  testing::TempDir dir;
  const std::string build = dir.path() + "/build";
  ASSERT_EQ(InSourceDir("mkdir -p '" + build + "' && echo PSTRAIN_PYTHON:BOOL=OFF > '" + build +
                        "/CMakeCache.txt'")
                .exit_code,
            0);
  auto run = InSourceDir("'" + PythonExecutable() + "' setup.py build_ext --build-temp '" +
                             dir.path() + "/tmp' --build-lib '" + dir.path() + "/lib'",
                         {{"PSTRAIN_BUILD_DIR", build}});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("has PSTRAIN_PYTHON=OFF"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("-DPSTRAIN_PYTHON=ON"), std::string::npos) << run.output;
}

}  // namespace
}  // namespace pstrain
