# The expert-layer suite (issue 6). Included from src/moe/CMakeLists.txt while
# tests/CMakeLists.txt adds tests/moe twice (see there); move to tests/moe/CMakeLists.txt with
# ubep_test(test_moe test_moe.cpp) plus the ubep_moe link once that is fixed.
find_package(GTest REQUIRED)
include(GoogleTest)
enable_testing()
add_executable(test_moe ${PROJECT_SOURCE_DIR}/tests/moe/test_moe.cpp)
target_link_libraries(test_moe PRIVATE ubep_moe ubep_internal GTest::gtest_main)
gtest_discover_tests(test_moe DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
