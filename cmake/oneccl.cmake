# oneCCL's all-to-all-v as a baseline transport (docs/INTEGRATIONS.md, "oneCCL"): optional, used
# only when -DUBEP_ONECCL_ROOT names a prefix holding PyPI's oneccl-cpu-devel (a venv:
# `scripts/venv.sh --oneccl` makes a small one, .venv-ccl). Without it nothing here is built and
# the core build needs Debian's packages only.
#
# The target ubep_oneccl_exchange (tools/bench/oneccl_exchange.cpp: ubep::BulkExchange over
# ccl::alltoallv) serves ubep-bench --algo oneccl and the Python extension's
# Baseline(buffer, exchange="oneccl"). It links the CPU static libccl.a (the wheel's libccl.so
# needs a libccl.so.2 no wheel ships); oneccl_shim.cpp supplies the Intel-compiler helpers that
# archive calls. An object library (the shim's objects must reach every link that takes
# libccl.a, whatever the archive order) and PIC, so the extension module can take it in.
set(UBEP_ONECCL_ROOT "" CACHE PATH "prefix with include/oneapi/ccl.hpp and lib/ccl/cpu/lib/libccl.a")
if(UBEP_ONECCL_ROOT)
  set(UBEP_ONECCL_ARCHIVE ${UBEP_ONECCL_ROOT}/lib/ccl/cpu/lib/libccl.a)
  if(NOT EXISTS ${UBEP_ONECCL_ROOT}/include/oneapi/ccl.hpp OR NOT EXISTS ${UBEP_ONECCL_ARCHIVE})
    message(FATAL_ERROR "UBEP_ONECCL_ROOT=${UBEP_ONECCL_ROOT}: no include/oneapi/ccl.hpp or "
                        "lib/ccl/cpu/lib/libccl.a there (pip install --no-deps "
                        "oneccl-cpu-devel==2022.2.0 into a venv: scripts/venv.sh --oneccl)")
  endif()
  find_library(UBEP_HWLOC hwloc REQUIRED)
  add_library(ubep_oneccl_exchange OBJECT ${PROJECT_SOURCE_DIR}/tools/bench/oneccl_exchange.cpp
              ${PROJECT_SOURCE_DIR}/tools/bench/oneccl_shim.cpp)
  set_target_properties(ubep_oneccl_exchange PROPERTIES POSITION_INDEPENDENT_CODE ON)
  target_include_directories(ubep_oneccl_exchange PUBLIC ${PROJECT_SOURCE_DIR}/tools
                             PRIVATE ${UBEP_ONECCL_ROOT}/include)
  target_link_libraries(ubep_oneccl_exchange PUBLIC ubep_internal ${UBEP_ONECCL_ARCHIVE}
                        ${UBEP_HWLOC} ${CMAKE_DL_LIBS} Threads::Threads)
  target_compile_definitions(ubep_oneccl_exchange INTERFACE UBEP_HAVE_ONECCL=1)
  message(STATUS "oneCCL baseline: ${UBEP_ONECCL_ARCHIVE}")
endif()
