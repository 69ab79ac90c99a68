# The command line end to end (included at the end of CMakeLists.txt's test section):
# tests/cli/tokenize_cli_test.sh runs the `tessera` binary on the byte tokenizer and the
# SentencePiece fixture (tokenize round trips, bad ids, --info/--stats, data prepare
# with several threads), one ctest per case.
add_dependencies(tessera_tests tessera_cli)
foreach(case byte_round_trip spm_round_trip bad_ids info_and_stats prepare_threads)
  add_test(NAME cli.tokenize_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/tokenize_cli_test.sh
                                             $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.tokenize_${case} PROPERTIES LABELS cli TIMEOUT 60)
endforeach()

# tests/cli/interop_cli_test.sh: a BPE-tokenized training run sampled back, and the
# Hugging Face import/export round trip with its error cases.
foreach(case bpe_train_sample hf_round_trip)
  add_test(NAME cli.interop_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/interop_cli_test.sh
                                            $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.interop_${case} PROPERTIES LABELS cli TIMEOUT 120)
endforeach()

# tests/cli/launch_cli_test.sh: `tessera launch` restarting a SIGKILLed training run that
# resumes to byte-identical params, and the exit codes a scheduler sees.
foreach(case kill_resume exit_codes)
  add_test(NAME cli.launch_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/launch_cli_test.sh
                                           $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.launch_${case} PROPERTIES LABELS cli TIMEOUT 180)
endforeach()

# tests/cli/fault_cli_test.sh: TESSERA_FAULT kill@step SIGKILLs `tessera train`, the same
# command resumes to byte-identical params; hang@step is ended by a timeout.
foreach(case kill_resume hang)
  add_test(NAME cli.fault_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/fault_cli_test.sh
                                          $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.fault_${case} PROPERTIES LABELS cli TIMEOUT 120)
endforeach()

# tests/cli/failure_list_cli_test.sh: a TESSERA_FAULT list (kill@step, kill@save,
# kill@restore, corrupt_newest) under `tessera launch`, and kills in a synchronous save
# and a restore: each restart makes progress, final state byte-identical.
foreach(case launch_list sync_save)
  add_test(NAME cli.failure_list_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/failure_list_cli_test.sh
                                                 $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.failure_list_${case} PROPERTIES LABELS "cli;resilience" TIMEOUT 120)
endforeach()

# tests/cli/full_disk_cli_test.sh: checkpoint writes the OS refuses (RLIMIT_FSIZE -> EFBIG,
# async and sync saves; a tiny tmpfs -> ENOSPC, skipped without CAP_SYS_ADMIN): a clear
# error, the committed checkpoints intact, a resume with room byte-identical.
foreach(case fsize fsize_sync tmpfs)
  add_test(NAME cli.full_disk_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/full_disk_cli_test.sh
                                              $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.full_disk_${case} PROPERTIES LABELS "cli;resilience" TIMEOUT 120)
endforeach()

# tests/cli/launch_modes_cli_test.sh: `tessera launch --srun` against a srun stand-in
# (tests/cli/srun_stand_in/srun; no Slurm here) and, with mpirun, `--mpi` on a 2-rank
# data-parallel run: a killed rank restarts the job, final state byte-identical.
foreach(case srun_kill srun_budget)
  add_test(NAME cli.launch_modes_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/launch_modes_cli_test.sh
                                                 $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case})
  set_tests_properties(cli.launch_modes_${case} PROPERTIES LABELS "cli;resilience" TIMEOUT 120)
endforeach()
if(TESSERA_HAS_MPI AND TESSERA_MPIEXEC)
  add_test(NAME cli.launch_modes_mpi_kill COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/launch_modes_cli_test.sh
                                                  $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} mpi_kill ${TESSERA_MPIEXEC})
  set_tests_properties(cli.launch_modes_mpi_kill PROPERTIES LABELS "cli;mpi;resilience" TIMEOUT 120)
endif()
