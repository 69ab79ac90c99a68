# Examples run as tests (ctest). Include from the top-level CMakeLists.txt inside
# if(TESSERA_BUILD_TESTS), after the example_* targets are defined:
#   include(cmake/example_tests.cmake)
if(TARGET example_parallel_matmul)
  # The SPMD hello world at a small size: 8 virtual devices, exits 1 when the sharded
  # product differs from the float64 reference.
  add_dependencies(tessera_tests example_parallel_matmul)
  add_test(NAME example.parallel_matmul COMMAND example_parallel_matmul --size 512)
  set_tests_properties(example.parallel_matmul PROPERTIES LABELS "spmd;examples" TIMEOUT 60
                                                          ENVIRONMENT "TESSERA_CPU_DEVICES=8")
endif()

if(TARGET example_custom_kernel)
  # A sliding-window attention custom op in a one-block model: forward and gradients
  # against the attention composed of built-in ops; exits 1 when they differ.
  add_dependencies(tessera_tests example_custom_kernel)
  add_test(NAME example.custom_kernel COMMAND example_custom_kernel --steps 10)
  set_tests_properties(example.custom_kernel PROPERTIES LABELS "core;examples" TIMEOUT 120)
endif()
