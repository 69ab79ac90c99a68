# GPU tests beyond what gtest_discover_tests registers (include after cmake/multiprocess_tests.cmake
# in CMakeLists.txt's test section). Label "cuda", so `ctest -L cuda` runs them with the
# rest of test_cuda.
#
# The NCCL communicator one process per GPU: two test_cuda processes run
# tests/cuda/test_cuda_nccl.cpp's NcclMultiProcess.* tests together,
#   * cuda.nccl_mpi_*_np2: under `mpirun -n 2` (MPI build; the MPI bootstrap),
#   * cuda.nccl_file_*_np2: started side by side by sh with TESSERA_NCCL_RANK=0/1 and a
#     fresh TESSERA_NCCL_BOOTSTRAP_DIR (the file bootstrap; no MPI needed).
# With fewer than 2 GPUs every process skips (gtest prints "[  SKIPPED ]") and ctest
# reports the test as skipped, not passed.
if(TESSERA_HAS_NCCL AND TARGET test_cuda)
  # Only when test_cuda holds the NCCL tests (TESSERA_TEST_GLOB may leave them out).
  file(GLOB tessera_cuda_test_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/${TESSERA_TEST_GLOB}.cpp)
  list(FIND tessera_cuda_test_sources ${CMAKE_SOURCE_DIR}/tests/cuda/test_cuda_nccl.cpp tessera_nccl_test_index)
  if(tessera_nccl_test_index GREATER -1)
    set(nccl_skip_regex "\\[  SKIPPED \\]")
    set(nccl_abort_regex "rank 0 caught after [0-9.]+ s: .*rank 1 fails on purpose")

    if(TESSERA_HAS_MPI AND TESSERA_MPIEXEC)
      # As cmake/multiprocess_tests.cmake: root in containers, more ranks than cores, no CMA.
      set(nccl_mpi_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                       OMPI_MCA_btl_vader_single_copy_mechanism=none)
      add_test(NAME cuda.nccl_mpi_collectives_np2
               COMMAND ${TESSERA_MPIEXEC} -n 2 --oversubscribe $<TARGET_FILE:test_cuda>
                       --gtest_filter=NcclMultiProcess.Collectives)
      set_tests_properties(cuda.nccl_mpi_collectives_np2 PROPERTIES LABELS cuda TIMEOUT 600
                           ENVIRONMENT "${nccl_mpi_env}" SKIP_REGULAR_EXPRESSION "${nccl_skip_regex}")
      # A failing rank makes the other throw instead of hanging; the job then ends with
      # MPI_Abort (nonzero status), so the test looks for rank 0's report instead.
      add_test(NAME cuda.nccl_mpi_abort_np2
               COMMAND ${TESSERA_MPIEXEC} -n 2 --oversubscribe $<TARGET_FILE:test_cuda>
                       --gtest_filter=NcclMultiProcess.Abort)
      set_tests_properties(cuda.nccl_mpi_abort_np2 PROPERTIES LABELS cuda TIMEOUT 300 ENVIRONMENT "${nccl_mpi_env}"
                           SKIP_REGULAR_EXPRESSION "${nccl_skip_regex}" PASS_REGULAR_EXPRESSION "${nccl_abort_regex}")
    endif()

    # Two processes through the file bootstrap: $0 is test_cuda, $1 the gtest filter; the
    # test passes when both exit 0. The directory is fresh per run and removed after.
    set(nccl_two_processes
        "d=$(mktemp -d) || exit 1; \
         TESSERA_NCCL_RANK=0 TESSERA_NCCL_WORLD_SIZE=2 TESSERA_NCCL_BOOTSTRAP_DIR=$d \"$0\" \"$1\" & p0=$!; \
         TESSERA_NCCL_RANK=1 TESSERA_NCCL_WORLD_SIZE=2 TESSERA_NCCL_BOOTSTRAP_DIR=$d \"$0\" \"$1\" & p1=$!; \
         wait $p0; s0=$?; wait $p1; s1=$?; rm -rf \"$d\"; \
         echo \"exit status: rank 0 $s0, rank 1 $s1\"; [ $s0 -eq 0 ] && [ $s1 -eq 0 ]")
    foreach(case Collectives Abort)
      string(TOLOWER ${case} lower)
      add_test(NAME cuda.nccl_file_${lower}_np2
               COMMAND sh -c "${nccl_two_processes}" $<TARGET_FILE:test_cuda>
                       --gtest_filter=NcclMultiProcess.${case})
      set_tests_properties(cuda.nccl_file_${lower}_np2 PROPERTIES LABELS cuda TIMEOUT 600
                           SKIP_REGULAR_EXPRESSION "${nccl_skip_regex}")
    endforeach()
    set_tests_properties(cuda.nccl_file_abort_np2 PROPERTIES PASS_REGULAR_EXPRESSION "${nccl_abort_regex}")
  endif()
endif()

# SPMD programs on one GPU: test_cuda's *GpuSpmd* tests (tests/cuda/test_cuda_spmd.cpp) need
# 8 CUDA devices, so they run here again with TESSERA_GPU_VIRTUAL_DEVICES=8 (8 virtual
# devices of GPU 0, each its own stream and allocator). Without a GPU they skip, and ctest
# reports the test as skipped.
if(TARGET test_cuda)
  file(GLOB tessera_cuda_spmd_test CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/${TESSERA_TEST_GLOB}.cpp)
  list(FIND tessera_cuda_spmd_test ${CMAKE_SOURCE_DIR}/tests/cuda/test_cuda_spmd.cpp tessera_cuda_spmd_index)
  if(tessera_cuda_spmd_index GREATER -1)
    add_test(NAME cuda.spmd_virtual_devices COMMAND test_cuda --gtest_filter=*GpuSpmd*)
    set_tests_properties(cuda.spmd_virtual_devices PROPERTIES LABELS cuda TIMEOUT 900
                         ENVIRONMENT TESSERA_GPU_VIRTUAL_DEVICES=8 SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
    # A value that is not a count is the reason no GPU is used (runs without a GPU too).
    add_test(NAME cuda.virtual_devices_bad_value COMMAND test_cuda
                                                         --gtest_filter=GpuVirtualDevices.ABadCountIsTheReasonNoGpuIsUsed)
    set_tests_properties(cuda.virtual_devices_bad_value PROPERTIES LABELS cuda ENVIRONMENT TESSERA_GPU_VIRTUAL_DEVICES=eight
                                                                  SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
  endif()
endif()

# The flash-attention kernels' index math on the CPU: tools/flash_attention_emulation.cpp
# compiles the kernel sources as host C++ (every CUDA thread a fiber; mma.sync, ldmatrix
# and cp.async from their PTX fragment layouts; cp.async destinations poisoned until the
# wait that retires them) and runs v1 and v2, forward and backward, on 55 problems against
# a float64 reference, and v2 on 4 packed-layout problems (q, k, v read from a fused qkv,
# out and dqkv written in place, bitwise the contiguous v2's). It needs the CUDA headers,
# not a GPU, so it runs wherever the CUDA backend builds, GPU or not (about 2.5 minutes).
if(TESSERA_HAS_CUDA AND TESSERA_BUILD_TESTS)
  add_executable(flash_attention_emulation ${CMAKE_SOURCE_DIR}/tools/flash_attention_emulation.cpp)
  target_include_directories(flash_attention_emulation PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/include
                                                               ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(flash_attention_emulation PRIVATE tessera_warnings)
  # The kernels' `#pragma unroll` means nothing to the host compiler.
  target_compile_options(flash_attention_emulation PRIVATE -Wno-unknown-pragmas)
  set_target_properties(flash_attention_emulation PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
  add_test(NAME cuda.flash_attention_emulation COMMAND flash_attention_emulation)
  set_tests_properties(cuda.flash_attention_emulation PROPERTIES LABELS cuda TIMEOUT 600)
endif()
