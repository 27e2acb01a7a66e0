"""Builds spdl_client's extension with CMake (see pyproject.toml for how to install).

The extension is CMakeLists.txt's target `spdl_python`, built in CMake's standalone mode: only the
client library and what it needs, not the daemon.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        if not (HERE.parent.parent / "client" / "client.cc").is_file():
            sys.exit("spdl_client: build from a checkout of the spdld repository (pip install ./client/python): "
                     "the C++ client library's sources are not beside this directory")
        configure = [
            "cmake", "-S", str(HERE), "-B", str(build_dir),
            f"-DPython3_EXECUTABLE={sys.executable}",
            f"-DSPDL_PY_OUTPUT_DIR={out_dir}",
            f"-DCMAKE_BUILD_TYPE={'Debug' if self.debug else 'Release'}",
        ]
        if shutil.which("ninja") and not (build_dir / "CMakeCache.txt").exists():
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        subprocess.run(["cmake", "--build", str(build_dir), "--target", "spdl_python", "-j", jobs], check=True)


setup(ext_modules=[CMakeExtension("spdl_client._spdl_client")], cmdclass={"build_ext": CMakeBuild})
