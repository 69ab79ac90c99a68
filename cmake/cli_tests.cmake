# The command line end to end (included at the end of CMakeLists.txt's test section): each
# tests/cli/<name>_cli_test.sh runs the `tessera` binary, one ctest per case.
add_dependencies(tessera_tests tessera_cli)

# tessera_cli_cases(NAME LABELS TIMEOUT CASE...): ctests cli.NAME_CASE running
# `bash tests/cli/NAME_cli_test.sh tessera source-dir CASE [ARGS]` (ARGS: CLI_CASE_ARGS;
# extra environment: CLI_CASE_ENV). A script that cannot run its case here exits 77 (skip in
# tests/cli/cli_common.sh), which ctest reports as skipped.
function(tessera_cli_cases name labels timeout)
  foreach(case ${ARGN})
    add_test(NAME cli.${name}_${case} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/${name}_cli_test.sh
                                              $<TARGET_FILE:tessera_cli> ${CMAKE_SOURCE_DIR} ${case} ${CLI_CASE_ARGS})
    set_tests_properties(cli.${name}_${case} PROPERTIES LABELS "${labels}" TIMEOUT ${timeout} SKIP_RETURN_CODE 77)
    # Automatic local checkpoint tiers in the build tree (CMakeLists.txt says why).
    set(case_env TESSERA_LOCAL_TIER_ROOT=${CMAKE_BINARY_DIR}/test-local-tiers ${CLI_CASE_ENV})
    set_tests_properties(cli.${name}_${case} PROPERTIES ENVIRONMENT "${case_env}")
  endforeach()
endfunction()

# The byte tokenizer and the SentencePiece fixture: tokenize round trips, bad ids,
# --info/--stats, data prepare with several threads, data stats on a two-source mixture.
tessera_cli_cases(tokenize cli 60 byte_round_trip spm_round_trip bad_ids info_and_stats prepare_threads data_stats)

# A BPE-tokenized training run sampled back, and the Hugging Face import/export round trip
# with its error cases.
tessera_cli_cases(interop cli 120 bpe_train_sample hf_round_trip)

# `tessera launch` restarting a SIGKILLed training run that resumes to byte-identical
# params, and the exit codes a scheduler sees.
tessera_cli_cases(launch cli 180 kill_resume exit_codes verbatim_command)

# TESSERA_FAULT kill@step SIGKILLs `tessera train`, the same command resumes to
# byte-identical params (also through the data pipeline, resumed with another worker
# count); hang@step is ended by a timeout.
tessera_cli_cases(fault cli 120 kill_resume kill_resume_pipeline hang)

# A TESSERA_FAULT list (kill@step, kill@save, kill@restore, corrupt_newest) under
# `tessera launch`, and kills in a synchronous save and a restore: each restart makes
# progress, final state byte-identical.
tessera_cli_cases(failure_list "cli;resilience" 120 launch_list sync_save)

# Checkpoint writes the OS refuses (RLIMIT_FSIZE -> EFBIG, async and sync saves; a tiny
# tmpfs -> ENOSPC, skipped without CAP_SYS_ADMIN): a clear error, the committed
# checkpoints intact, a resume with room byte-identical.
tessera_cli_cases(full_disk "cli;resilience" 120 fsize fsize_sync tmpfs)

# `tessera launch --srun` against a srun stand-in (tests/cli/srun_stand_in/srun; no Slurm
# here) and, with mpirun, `--mpi` on a 2-rank data-parallel run: a killed rank restarts
# the job, final state byte-identical; and a stop and resume of 4 pipeline processes that
# hold shards of their stages' state.
tessera_cli_cases(launch_modes "cli;resilience" 120 srun_kill srun_budget srun_stand_in_status)
# Per-rank goodput records and straggler attribution under each launch mode: rank 1 of 2
# slowed by TESSERA_FAULT slow@step, named by `tessera goodput` (text, --json, --html).
tessera_cli_cases(launch_modes "cli;goodput" 120 fork_stragglers srun_stragglers srun_queue_wait)
if(TESSERA_HAS_MPI AND TESSERA_MPIEXEC)
  set(CLI_CASE_ARGS ${TESSERA_MPIEXEC})
  set(CLI_CASE_ENV "${mpi_test_env}")  # cmake/multiprocess_tests.cmake: no LeakSanitizer for OpenMPI
  tessera_cli_cases(launch_modes "cli;mpi;resilience" 120 mpi_kill mpi_term_one_rank mpi_pipeline_shards)
  tessera_cli_cases(launch_modes "cli;mpi;goodput" 120 mpi_stragglers)
  # `tessera launch --hosts` across 2 test hosts (tools/testbed.sh: network namespaces):
  # bitwise the one-process run, a kill on the second host restarted, the clear errors.
  # The hosts are one set per machine, so these cases run one at a time.
  tessera_cli_cases(multihost "cli;mpi;multihost" 180 two_hosts two_per_host kill_restart errors)
  set_tests_properties(cli.multihost_two_hosts cli.multihost_two_per_host cli.multihost_kill_restart cli.multihost_errors
                       PROPERTIES RESOURCE_LOCK tessera_testbed)
  # A real Slurm on those hosts (slurmctld, a slurmd per host, PMIx): `tessera launch
  # --srun` restarting a killed rank, a spent budget requeued by Slurm, scancel saving a
  # checkpoint, the queue wait measured from Slurm.
  tessera_cli_cases(slurm "cli;mpi;multihost" 240 kill_restart budget_requeue scancel queue_wait)
  set_tests_properties(cli.slurm_kill_restart cli.slurm_budget_requeue cli.slurm_scancel cli.slurm_queue_wait
                       PROPERTIES RESOURCE_LOCK tessera_testbed)
  unset(CLI_CASE_ARGS)
  unset(CLI_CASE_ENV)
endif()

# TCP jobs (`tessera launch --coordinator`, no MPI): bitwise the one-process run on one
# host and as two launchers (two "hosts" on this machine), a killed rank restarted by both
# launchers, the usage errors; test_hosts across tools/testbed.sh's network namespaces.
tessera_cli_cases(tcp "cli;resilience" 180 one_host two_nodes kill_restart errors)
tessera_cli_cases(tcp "cli;multihost" 180 test_hosts)
set_tests_properties(cli.tcp_test_hosts PROPERTIES RESOURCE_LOCK tessera_testbed)

# The kill soak, reduced (bench/resilience/kill_soak.sh; the full one is 100 kills):
# 20 SIGKILLs of supervised runs with asynchronous and synchronous saves, in saves,
# restores, start-up and steps; final state byte-identical, every checkpoint verifies.
# The sanitizer tree runs the asynchronous half alone (10 kills over 300 steps, every
# kind of kill among them) in half the time: its steps are several times slower, and the
# synchronous saves' paths are the Release tree's to soak.
if(TESSERA_SANITIZE)
  set(TESSERA_SOAK_KILLS 10)
  set(TESSERA_SOAK_ENV "STEPS=300;SAVES=async")
else()
  set(TESSERA_SOAK_KILLS 20)
  set(TESSERA_SOAK_ENV "STEPS=600")
endif()
add_test(NAME resilience.kill_soak_reduced
         COMMAND bash ${CMAKE_SOURCE_DIR}/bench/resilience/kill_soak.sh ${TESSERA_SOAK_KILLS}
                 ${CMAKE_BINARY_DIR}/kill-soak $<TARGET_FILE:tessera_cli>
         WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
set_tests_properties(resilience.kill_soak_reduced PROPERTIES LABELS "cli;resilience;soak" TIMEOUT 600 ENVIRONMENT
                                                             "${TESSERA_SOAK_ENV}")

# tessera plan: catalog tables and --json (strong scaling monotone), --explain, the
# measured host with its collectives, the clear errors, tessera train --mesh auto, and the
# --html page.
tessera_cli_cases(plan cli 300 catalog explain host errors mesh_auto html)

# tessera k8s render: the manifests byte-identical to the golden the schema oracle
# validated (tests/oracles/k8s_manifests.py), each pod's command as Kubernetes expands it
# is the `tessera launch` command expected, and the clear errors; the pods of a 2-host Job
# run on the test hosts, bitwise the one-process training.
tessera_cli_cases(k8s cli 60 golden pod_commands errors)
tessera_cli_cases(k8s "cli;multihost" 180 pods_on_test_hosts)
set_tests_properties(cli.k8s_pods_on_test_hosts PROPERTIES RESOURCE_LOCK tessera_testbed)
