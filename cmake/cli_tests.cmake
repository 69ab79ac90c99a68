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
