# Multi-process tests (included at the end of CMakeLists.txt's test section): the
# collectives and the parallel GPT step with one process per device, under mpirun (when
# CMake found MPI and mpirun) and as a TCP job started by `tessera launch --coordinator`
# (always: it needs nothing but sockets).
add_executable(multiprocess_collectives tests/spmd/multiprocess/collectives_main.cpp)
target_include_directories(multiprocess_collectives PRIVATE src tests)
target_link_libraries(multiprocess_collectives PRIVATE tessera tessera_warnings)
add_dependencies(tessera_tests multiprocess_collectives)
add_executable(multiprocess_train tests/spmd/multiprocess/train_main.cpp)
target_include_directories(multiprocess_train PRIVATE src tests)
target_link_libraries(multiprocess_train PRIVATE tessera_train tessera_warnings)
add_dependencies(tessera_tests multiprocess_train tessera_cli)

# A TCP job on this machine: `tessera launch` starts N ranks that meet at a free
# loopback port (HOST:0 with one host), without restarts, its goodput log in the build tree.
function(tessera_tcp_test name np timeout)
  add_test(NAME spmd.tcp_${name}_np${np}
           COMMAND $<TARGET_FILE:tessera_cli> launch --nproc ${np} --coordinator 127.0.0.1:0 --max-restarts 0
                   --run-dir ${CMAKE_BINARY_DIR}/tcp-tests/${name}_np${np} -- ${ARGN})
  set_tests_properties(spmd.tcp_${name}_np${np} PROPERTIES LABELS spmd TIMEOUT ${timeout})
endfunction()
foreach(np 2 4)
  tessera_tcp_test(collectives ${np} 120 $<TARGET_FILE:multiprocess_collectives>)
  tessera_tcp_test(train ${np} 300 $<TARGET_FILE:multiprocess_train>)
endforeach()
# A failing rank makes the others throw (the abort note names it) instead of hanging.
tessera_tcp_test(abort 2 60 $<TARGET_FILE:multiprocess_collectives> abort)
set_tests_properties(spmd.tcp_abort_np2 PROPERTIES PASS_REGULAR_EXPRESSION
                     "rank 0 caught after [0-9.]+ s: all_reduce on devices \\[0, 1\\]: aborted: rank 1: device 1 failed: rank 1 fails on purpose")

if(TESSERA_HAS_MPI)
  if(TESSERA_MPIEXEC)
    # Containers often run tests as root, which mpirun refuses unless told; more ranks
    # than cores (-n 4 on 2 cores) needs --oversubscribe; vader's single-copy (CMA)
    # needs ptrace rights that containers usually lack.
    set(mpi_test_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
                     OMPI_MCA_btl_vader_single_copy_mechanism=none)
    if(TESSERA_SANITIZE)
      # OpenMPI itself leaks at exit (its own allocations and dlopen'ed components), so
      # LeakSanitizer is off for the MPI programs; our code's leaks are checked by the
      # same collectives and training step in-process (test_spmd) and as a TCP job.
      list(APPEND mpi_test_env
           "ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1")
    endif()
    foreach(np 2 4)
      add_test(NAME spmd.mpi_collectives_np${np}
               COMMAND ${TESSERA_MPIEXEC} -n ${np} --oversubscribe $<TARGET_FILE:multiprocess_collectives>)
      set_tests_properties(spmd.mpi_collectives_np${np} PROPERTIES LABELS spmd TIMEOUT 120
                                                                   ENVIRONMENT "${mpi_test_env}")
      # The GPT step of tests/spmd/test_parallel_train.cpp, a process per device.
      add_test(NAME spmd.mpi_train_np${np}
               COMMAND ${TESSERA_MPIEXEC} -n ${np} --oversubscribe $<TARGET_FILE:multiprocess_train>)
      set_tests_properties(spmd.mpi_train_np${np} PROPERTIES LABELS spmd TIMEOUT 300 ENVIRONMENT "${mpi_test_env}")
    endforeach()
    # A failing rank makes the others throw instead of hanging; the job then ends with
    # MPI_Abort (nonzero status), so the test looks for rank 0's report instead.
    add_test(NAME spmd.mpi_abort_np2 COMMAND ${TESSERA_MPIEXEC} -n 2 --oversubscribe
                                             $<TARGET_FILE:multiprocess_collectives> abort)
    set_tests_properties(spmd.mpi_abort_np2 PROPERTIES LABELS spmd TIMEOUT 60 ENVIRONMENT "${mpi_test_env}"
                         PASS_REGULAR_EXPRESSION "rank 0 caught after [0-9.]+ s: all_reduce on devices \\[0, 1\\]: aborted: rank 1: device 1 failed: rank 1 fails on purpose")
    # The command line end to end: `mpirun -n 2 tessera train --mesh fsdp=2` on a small
    # model (rank 0 prints the summary and writes the run directory).
    add_test(NAME spmd.mpi_cli_train_np2
             COMMAND ${TESSERA_MPIEXEC} -n 2 --oversubscribe $<TARGET_FILE:tessera_cli> train --config
                     ${CMAKE_SOURCE_DIR}/configs/tiny.toml --mesh fsdp=2 -q --set model.dim=64 --set model.layers=2
                     --set train.seq=32 --set train.steps=4 --set train.eval_batches=1
                     --set run.dir=\"${CMAKE_BINARY_DIR}/mpi_cli_run\" --set data.train=\"${CMAKE_BINARY_DIR}/mpi_cli_data/train.bin\"
                     --set data.val=\"${CMAKE_BINARY_DIR}/mpi_cli_data/val.bin\")
    set_tests_properties(spmd.mpi_cli_train_np2 PROPERTIES LABELS spmd TIMEOUT 300 ENVIRONMENT "${mpi_test_env}"
                         PASS_REGULAR_EXPRESSION "mesh \\(fsdp=2\\) \\(mpi \\(rank 0 of 2\\)\\)")
    # ... and with a pipeline axis: a stage per process (train/pipeline_step.h).
    add_test(NAME spmd.mpi_cli_pipeline_np2
             COMMAND ${TESSERA_MPIEXEC} -n 2 --oversubscribe $<TARGET_FILE:tessera_cli> train --config
                     ${CMAKE_SOURCE_DIR}/configs/tiny.toml --mesh pipeline=2 -q --set model.dim=64 --set model.layers=2
                     --set train.seq=32 --set train.steps=4 --set train.eval_batches=1
                     --set run.dir=\"${CMAKE_BINARY_DIR}/mpi_cli_pipeline_run\"
                     --set data.train=\"${CMAKE_BINARY_DIR}/mpi_cli_data/train.bin\"
                     --set data.val=\"${CMAKE_BINARY_DIR}/mpi_cli_data/val.bin\")
    set_tests_properties(spmd.mpi_cli_pipeline_np2 PROPERTIES LABELS spmd TIMEOUT 300 ENVIRONMENT "${mpi_test_env}"
                         DEPENDS spmd.mpi_cli_train_np2
                         PASS_REGULAR_EXPRESSION "pipeline 2 x data 1 \\(2 processes, one device each: mpi \\(rank 0 of 2\\)\\)")
    # ... and with tensor parallelism inside each stage: 2 stages x 2 tensor devices.
    add_test(NAME spmd.mpi_cli_pipeline_tensor_np4
             COMMAND ${TESSERA_MPIEXEC} -n 4 --oversubscribe $<TARGET_FILE:tessera_cli> train --config
                     ${CMAKE_SOURCE_DIR}/configs/tiny.toml --mesh pipeline=2,tensor=2 -q --set model.dim=64
                     --set model.layers=2 --set train.seq=32 --set train.steps=4 --set train.eval_batches=1
                     --set run.dir=\"${CMAKE_BINARY_DIR}/mpi_cli_pipeline_tensor_run\"
                     --set data.train=\"${CMAKE_BINARY_DIR}/mpi_cli_data/train.bin\"
                     --set data.val=\"${CMAKE_BINARY_DIR}/mpi_cli_data/val.bin\")
    set_tests_properties(spmd.mpi_cli_pipeline_tensor_np4 PROPERTIES LABELS spmd TIMEOUT 300 ENVIRONMENT "${mpi_test_env}"
                         DEPENDS spmd.mpi_cli_train_np2
                         PASS_REGULAR_EXPRESSION "pipeline 2 x \\(tensor=2\\) inside each stage \\(4 processes, one device each: mpi \\(rank 0 of 4\\)\\)")
  else()
    message(STATUS "tessera: mpirun not found; the MPI tests (spmd.mpi_*) are not registered")
  endif()
endif()
