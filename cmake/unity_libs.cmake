# -DUBEP_UNITY_LIBS=ON (top-level CMakeLists.txt): the libraries compiled as unity builds.
# Every file of src/ includes much the same headers (the standard library's containers, threads
# and atomics, ubep's public and core headers); under ASan, TSan or the fuzzer's coverage
# instrumentation, parsing and instrumenting those again for each of ~60 files is most of the
# library's compile time (the figures: scripts/test.sh, where CI turns this on).
#
# A unity batch is one translation unit, so its files share their anonymous namespaces and
# file-static names: a file that defines a name a neighbour also defines is kept out of the
# batches below (SKIP_UNITY_BUILD_INCLUSION). Files with their own compile options or
# definitions (backend/cuda_sim/sim_ops.cpp) are kept out by CMake itself.
foreach(lib ubep ubep_sched ubep_moe)
  if(TARGET ${lib})
    set_target_properties(${lib} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE ${UBEP_UNITY_BATCH})
    # GCC warns when a class of one file holds a type of another file's anonymous namespace,
    # which in a unity batch is every such pair: noise, not a finding.
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set_property(TARGET ${lib} APPEND PROPERTY COMPILE_OPTIONS -Wno-subobject-linkage)
    endif()
  endif()
endforeach()
# The AVX2 and AVX-512 fp8 kernels both define load_values/encode (each under its own target
# attribute); host_heartbeat, rendezvous and mesh_collective each have their own kMagic.
set_source_files_properties(${PROJECT_SOURCE_DIR}/src/core/fp8_avx2.cpp
                            ${PROJECT_SOURCE_DIR}/src/core/fp8_avx512.cpp
                            ${PROJECT_SOURCE_DIR}/src/bootstrap/rendezvous.cpp
                            ${PROJECT_SOURCE_DIR}/src/bootstrap/mesh_collective.cpp
                            DIRECTORY ${PROJECT_SOURCE_DIR}/src
                            PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
