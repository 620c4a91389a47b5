# One precompiled header for the test suites: GoogleTest and the standard headers every suite
# includes, compiled once per build and reused by each test target (REUSE_FROM). Parsing them is
# ~1.5-2 s of the ~4-7 s a test source takes at -O3 here, over ~400 test sources in the CI's
# release and sanitizer builds. A target whose flags make the header unusable (GCC checks) simply
# parses it again. Off under a compiler launcher: ccache does not cache a compile that uses a PCH.
option(UBEP_TEST_PCH "Precompile GoogleTest and standard headers for the test targets" ON)

function(ubep_add_test_pch)
  if(NOT UBEP_TEST_PCH OR CMAKE_CXX_COMPILER_LAUNCHER)
    return()
  endif()
  # An executable, so that it is compiled as the test executables are (-fPIE: GCC refuses a PCH
  # built with other code-model flags).
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/ubep_test_pch.cpp "int main() { return 0; }\n")
  add_executable(ubep_test_pch ${CMAKE_CURRENT_BINARY_DIR}/ubep_test_pch.cpp)
  target_link_libraries(ubep_test_pch PRIVATE GTest::gtest)
  target_precompile_headers(ubep_test_pch PRIVATE
    <gtest/gtest.h> <algorithm> <atomic> <chrono> <cstring> <functional> <map> <memory> <string>
    <thread> <vector>)
endfunction()

# Every GoogleTest executable of the test folders (walked recursively) reuses the header, except
# the targets built with their own sanitizer flags.
function(ubep_reuse_test_pch dir)
  if(NOT TARGET ubep_test_pch)
    return()
  endif()
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    get_target_property(options ${t} COMPILE_OPTIONS)
    get_target_property(links ${t} LINK_LIBRARIES)
    if(t STREQUAL "ubep_test_pch" OR "${options}" MATCHES "-fsanitize"
       OR NOT "${links}" MATCHES "GTest::|ubep_test_support")
      continue()  # its own flags, or no GoogleTest (GCC would refuse the header: other macros)
    endif()
    if(type STREQUAL "EXECUTABLE")
      target_precompile_headers(${t} REUSE_FROM ubep_test_pch)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d IN LISTS subdirs)
    ubep_reuse_test_pch(${d})
  endforeach()
endfunction()
