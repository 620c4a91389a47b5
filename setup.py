"""Builds the _ubep extension with the project's CMake (pyproject.toml has the metadata).

The extension links libubep statically, so the installed package is the folder ubep/ alone.
Environment:
  UBEP_CMAKE_BUILD_DIR  an existing, configured CMake build folder to build the extension in
                        (incremental: the test suite's pip test reuses the tree under test);
                        default: a fresh one under setuptools' build_temp
  UBEP_CMAKE_ARGS       extra configure arguments (e.g. -DUBEP_WITH_MPI=OFF)
  CMAKE_BUILD_PARALLEL_LEVEL  build jobs (default 2)
"""
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("UBEP_CMAKE_BUILD_DIR")
        if not build or not os.path.exists(os.path.join(build, "CMakeCache.txt")):
            build = build or os.path.join(os.path.abspath(self.build_temp), "cmake")
            os.makedirs(build, exist_ok=True)
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            # Only what the package needs: no tests, tools, extras or install rules.
            subprocess.check_call(
                ["cmake", "-S", ROOT, "-B", build, *gen, "-DCMAKE_BUILD_TYPE=Release",
                 f"-DPython3_EXECUTABLE={sys.executable}", "-DUBEP_WITH_PYTHON=ON",
                 "-DUBEP_BUILD_TESTS=OFF", "-DUBEP_BUILD_TOOLS=OFF", "-DUBEP_WITH_EXTRAS=OFF",
                 "-DUBEP_BUILD_CUDA_TESTS=OFF", "-DUBEP_INSTALL=OFF",
                 *shlex.split(os.environ.get("UBEP_CMAKE_ARGS", ""))])
        env = dict(os.environ)
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", "2")
        subprocess.check_call(["cmake", "--build", build, "--target", "_ubep"], env=env)
        built = os.path.join(build, "python", "ubep")
        so = [f for f in os.listdir(built) if f.startswith("_ubep.") and f.endswith(".so")]
        if len(so) != 1:
            raise RuntimeError(f"expected one _ubep extension in {built}, found {so}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(os.path.join(built, so[0]), dest)


# setuptools' own build folders, out of the source folders (build/ is the usual CMake tree).
os.makedirs(os.path.join(ROOT, "build-pip"), exist_ok=True)
setup(ext_modules=[Extension("ubep._ubep", sources=[])], cmdclass={"build_ext": CMakeBuild},
      options={"build": {"build_base": "build-pip"}, "egg_info": {"egg_base": "build-pip"}})
