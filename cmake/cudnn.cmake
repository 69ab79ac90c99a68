# cuDNN's fused flash attention (backend/cuda/kernels/cudnn_attention.cpp), through the
# cuDNN frontend: a header-only C++ library, pinned below and fetched by the build from
# PyPI (the include/ folder of its wheel, kept in TESSERA_CUDNN_FRONTEND_DIR; never
# copied into the repo). The frontend opens libcudnn.so.9 at run time (dlopen), so
# tessera never links cuDNN: a machine without it runs tessera's own attention kernels,
# and `tessera info` says why.
#
# TESSERA_CUDNN = AUTO (default) | ON | OFF. AUTO builds it into a CUDA build when the
# toolkit has cudnn.h and the frontend can be had; ON makes a missing piece a configure
# error. Needs only CUDA; runs before the libraries are defined.

set(TESSERA_CUDNN AUTO CACHE STRING "Build cuDNN fused attention: AUTO, ON or OFF")
set_property(CACHE TESSERA_CUDNN PROPERTY STRINGS AUTO ON OFF)
set(TESSERA_HAS_CUDNN OFF)

# The frontend's pin: version, and the sha256 of its manylinux x86_64 CPython 3.11 wheel
# (the headers are the same in every wheel; this one is fetched whatever Python runs pip).
set(TESSERA_CUDNN_FRONTEND_VERSION 1.32.0)
set(TESSERA_CUDNN_FRONTEND_SHA256 c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0)
set(TESSERA_CUDNN_FRONTEND_DIR "$ENV{HOME}/.cache/tessera/cudnn-frontend-${TESSERA_CUDNN_FRONTEND_VERSION}"
    CACHE PATH "Where the pinned cuDNN frontend's headers are kept (fetched once)")

if(TESSERA_CUDNN STREQUAL "OFF")
  message(STATUS "tessera: cuDNN attention off (TESSERA_CUDNN=OFF)")
elseif(NOT TESSERA_HAS_CUDA)
  tessera_feature_unavailable(TESSERA_CUDNN "cuDNN attention" "this is a CPU-only build")
else()
  find_path(TESSERA_CUDNN_INCLUDE_DIR cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_program(TESSERA_PIP_PYTHON python3)
  set(header "${TESSERA_CUDNN_FRONTEND_DIR}/include/cudnn_frontend.h")
  if(NOT TESSERA_CUDNN_INCLUDE_DIR)
    tessera_feature_unavailable(TESSERA_CUDNN "cuDNN attention" "the CUDA toolkit has no cudnn.h")
  elseif(NOT EXISTS "${header}" AND NOT TESSERA_PIP_PYTHON)
    tessera_feature_unavailable(TESSERA_CUDNN "cuDNN attention" "no python3 to fetch the cuDNN frontend with pip")
  else()
    if(NOT EXISTS "${header}")
      message(STATUS "tessera: fetching nvidia-cudnn-frontend ${TESSERA_CUDNN_FRONTEND_VERSION} (headers) from PyPI")
      set(download "${CMAKE_BINARY_DIR}/_deps/cudnn-frontend-wheel")
      file(REMOVE_RECURSE "${download}")
      file(WRITE "${download}/requirements.txt"
           "nvidia-cudnn-frontend==${TESSERA_CUDNN_FRONTEND_VERSION} --hash=sha256:${TESSERA_CUDNN_FRONTEND_SHA256}\n")
      execute_process(
        COMMAND "${TESSERA_PIP_PYTHON}" -m pip download --quiet --disable-pip-version-check --no-deps
                --only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64
                --require-hashes -r "${download}/requirements.txt" -d "${download}"
        RESULT_VARIABLE pip_rc ERROR_VARIABLE pip_err OUTPUT_QUIET)
      file(GLOB wheel "${download}/nvidia_cudnn_frontend-*.whl")
      if(pip_rc EQUAL 0 AND wheel)
        # Only the headers; written into a fresh folder, then moved into place whole.
        execute_process(
          COMMAND "${TESSERA_PIP_PYTHON}" -c
                  "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(n, sys.argv[2]) for n in z.namelist() if n.startswith('include/')]"
                  "${wheel}" "${download}/unpacked" RESULT_VARIABLE unzip_rc)
        if(unzip_rc EQUAL 0 AND EXISTS "${download}/unpacked/include/cudnn_frontend.h")
          file(REMOVE_RECURSE "${TESSERA_CUDNN_FRONTEND_DIR}")
          get_filename_component(parent "${TESSERA_CUDNN_FRONTEND_DIR}" DIRECTORY)
          file(MAKE_DIRECTORY "${parent}")
          file(RENAME "${download}/unpacked" "${TESSERA_CUDNN_FRONTEND_DIR}")
        endif()
      endif()
    endif()
    if(EXISTS "${header}")
      set(TESSERA_HAS_CUDNN ON)
      message(STATUS "tessera: cuDNN attention on (frontend ${TESSERA_CUDNN_FRONTEND_VERSION}, "
                     "cudnn.h in ${TESSERA_CUDNN_INCLUDE_DIR}; libcudnn.so.9 is opened at run time)")
    else()
      string(STRIP "${pip_err}" pip_err)
      tessera_feature_unavailable(TESSERA_CUDNN "cuDNN attention" "nvidia-cudnn-frontend ${TESSERA_CUDNN_FRONTEND_VERSION} could not be fetched "
                                "(pip: ${pip_err})")
    endif()
  endif()
endif()
