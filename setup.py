"""`pip install .`: the pstrain Python package, built by this tree's CMake.

The extension module is the CMake target `pstrain_python` (python/CMakeLists.txt),
linked with the same libraries as the `pstrain` binary; nothing is compiled
twice or copied. setuptools only runs CMake and installs python/pstrain/ with
the module beside it.

    pip install --no-build-isolation .      # Debian 12: python3-setuptools, pybind11-dev
    PSTRAIN_BUILD_DIR=build pip install --no-build-isolation .   # reuse ./build

PSTRAIN_BUILD_DIR: a CMake build folder to build in (an existing one is built,
not reconfigured, and must have PSTRAIN_PYTHON on); unset: a fresh folder
under setuptools' build_temp, configured with the tests off. PSTRAIN_JOBS:
parallel compile jobs (default: all cores). The sdist (MANIFEST.in) holds the
C++ tree this builds from.
"""
import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("PSTRAIN_BUILD_DIR") or os.path.join(
            os.path.abspath(self.build_temp), "cmake")
        build_dir = os.path.abspath(build_dir)
        if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            os.makedirs(build_dir, exist_ok=True)
            subprocess.check_call([
                "cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
                "-DPSTRAIN_BUILD_TESTS=OFF", "-DPSTRAIN_PYTHON=ON",
                "-DPython3_EXECUTABLE=" + sys.executable])
        self._check_python_on(build_dir)
        jobs = os.environ.get("PSTRAIN_JOBS") or str(os.cpu_count() or 1)
        subprocess.check_call(["cmake", "--build", build_dir, "-j", jobs, "--target",
                               "pstrain_python"])
        name = "_pstrain" + sysconfig.get_config_var("EXT_SUFFIX")
        built = os.path.join(build_dir, "python", "pstrain", name)
        if not os.path.exists(built):
            raise RuntimeError("%s was not built: the CMake build in %s targets another Python "
                               "than %s (set PSTRAIN_BUILD_DIR to a fresh folder)"
                               % (built, build_dir, sys.executable))
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built, dest)

    @staticmethod
    def _check_python_on(build_dir):
        """Fails clearly unless the CMake build in build_dir has the Python package on."""
        with open(os.path.join(build_dir, "CMakeCache.txt"), encoding="utf-8",
                  errors="replace") as f:
            on = any(line.strip().upper() in ("PSTRAIN_PYTHON:BOOL=ON", "PSTRAIN_PYTHON:BOOL=TRUE",
                                              "PSTRAIN_PYTHON:BOOL=1")
                     for line in f)
        if not on:
            raise RuntimeError(
                "the CMake build in %s has PSTRAIN_PYTHON=OFF (its configure found no pybind11 or "
                "Python 3 headers, or turned it off), so it has no target pstrain_python: "
                "reconfigure it with cmake -S %s -B %s -DPSTRAIN_PYTHON=ON (Debian: python3-dev "
                "pybind11-dev), or unset PSTRAIN_BUILD_DIR for a fresh build"
                % (build_dir, ROOT, build_dir))


setup(
    package_dir={"": "python"},
    packages=["pstrain"],
    ext_modules=[CMakeExtension("pstrain._pstrain")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
