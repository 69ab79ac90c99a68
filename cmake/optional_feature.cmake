# Optional features with an AUTO | ON | OFF cache option (TESSERA_PYTHON, TESSERA_CUDNN):
# when a piece is missing, AUTO says so and builds without the feature, ON stops configure.
#   tessera_feature_unavailable(OPTION "what" reason pieces...)
function(tessera_feature_unavailable option what)
  string(CONCAT reason ${ARGN})
  if(${option} STREQUAL "ON")
    message(FATAL_ERROR "tessera: ${option}=ON but ${reason}")
  endif()
  message(STATUS "tessera: ${what} off: ${reason}")
endfunction()
