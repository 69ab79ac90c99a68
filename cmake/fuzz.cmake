# The libFuzzer targets (TESSERA_FUZZ=ON, clang; docs/fuzzing.md). Each fuzz/fuzz_<name>.cpp
# feeds its bytes to one parser of untrusted input and becomes the executable fuzz_<name>;
# fuzz/corpus/<name>/ holds its seeds. CMakeLists.txt compiles every library with
# -fsanitize=fuzzer-no-link,address,undefined; only these executables link libFuzzer's main.
#
# With the tests on, each target is also a ctest (label `fuzz`): a short run over its seeds,
# new inputs kept in the build tree (libFuzzer writes them to its first corpus folder, which
# must not be the committed seeds), a crash saved under fuzz-artifacts/.

set(TESSERA_FUZZ_SECONDS 8 CACHE STRING "Seconds each fuzz target runs as a ctest")
add_custom_target(tessera_fuzz_targets)
file(GLOB TESSERA_FUZZ_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/fuzz/fuzz_*.cpp)
foreach(source ${TESSERA_FUZZ_SOURCES})
  get_filename_component(target ${source} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" name ${target})
  add_executable(${target} ${source})
  target_include_directories(${target} PRIVATE src fuzz)
  target_compile_options(${target} PRIVATE -fsanitize=fuzzer)
  target_link_options(${target} PRIVATE -fsanitize=fuzzer)
  target_link_libraries(${target} PRIVATE tessera_train tessera_warnings)
  add_dependencies(tessera_fuzz_targets ${target})
  if(TESSERA_BUILD_TESTS)
    set(found ${CMAKE_BINARY_DIR}/fuzz-corpus/${name})
    file(MAKE_DIRECTORY ${found} ${CMAKE_BINARY_DIR}/fuzz-artifacts)
    # The caps make an input that allocates more than 2 GB, or runs for more than 10 s, a
    # failure (a bug in the parser), not a slow test.
    add_test(NAME fuzz.${name}
             COMMAND ${target} -max_total_time=${TESSERA_FUZZ_SECONDS} -rss_limit_mb=2048 -malloc_limit_mb=2048
                     -timeout=10 -print_final_stats=1 -artifact_prefix=${CMAKE_BINARY_DIR}/fuzz-artifacts/${name}-
                     ${found} ${CMAKE_SOURCE_DIR}/fuzz/corpus/${name})
    set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 120)
  endif()
endforeach()
# The seed generator (fuzz/make_seeds.cpp): an ordinary program, no libFuzzer main.
add_executable(fuzz_make_seeds ${CMAKE_SOURCE_DIR}/fuzz/make_seeds.cpp)
target_include_directories(fuzz_make_seeds PRIVATE src fuzz)
target_link_libraries(fuzz_make_seeds PRIVATE tessera_train tessera_warnings)
add_dependencies(tessera_fuzz_targets fuzz_make_seeds)
if(TESSERA_BUILD_TESTS)
  add_dependencies(tessera_tests tessera_fuzz_targets)
endif()
