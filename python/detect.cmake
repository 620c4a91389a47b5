# Included by the top-level CMakeLists before src/: decides UBEP_WITH_PYTHON (needs pybind11 and
# the Python headers) and, when on, builds the static libraries as position-independent code so
# they can be linked into the extension module.
#
# The interpreter defaults to Debian's /usr/bin/python3, where Debian's torch, numpy, mpi4py and
# pytest live: the python3 first on PATH may be another interpreter without them. Override with
# -DPython3_EXECUTABLE=...
if(NOT UBEP_WITH_PYTHON)
  return()
endif()
if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
  set(Python3_EXECUTABLE /usr/bin/python3 CACHE FILEPATH "Interpreter the Python package is built for")
endif()
find_package(Python3 COMPONENTS Interpreter Development.Module)
if(Python3_FOUND)
  set(PYBIND11_FINDPYTHON ON)  # pybind11 then reuses the Python3 found above
  find_package(pybind11 CONFIG QUIET)
endif()
if(NOT Python3_FOUND OR NOT pybind11_FOUND)
  message(WARNING "pybind11 or the Python headers not found: building without the Python package "
                  "(UBEP_WITH_PYTHON=OFF; Debian: apt-get install pybind11-dev python3-dev)")
  set(UBEP_WITH_PYTHON OFF)
  return()
endif()
set(CMAKE_POSITION_INDEPENDENT_CODE ON)
