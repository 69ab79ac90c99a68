# The Python package (`import tessera`, python/): a nanobind extension over the same
# libraries the C++ programs link, plus the pure-Python layer (pytrees, transforms).
#
# TESSERA_PYTHON = AUTO (default) | ON | OFF. AUTO builds it when Python >= 3.10 with its
# headers is found and nanobind can be had; ON makes a missing piece a configure error.
#
# nanobind (a build-time tool) is pinned in python/requirements-build.txt. Under
# `pip install .` scikit-build-core has already installed it into the build's Python;
# in an in-tree build (`make build`) it comes from PyPI into a cached venv,
# TESSERA_PYTHON_VENV (default ~/.cache/tessera/python-venv-<pins' hash>), together with
# python/requirements-test.txt (NumPy, ml_dtypes, pytest) that the tests run under.
#
# This file runs before the libraries are defined: an extension module is a shared
# object, so the static libraries it links are compiled position-independent
# (-fPIC -fno-semantic-interposition: calls inside a library stay direct).

set(TESSERA_PYTHON AUTO CACHE STRING "Build the Python package: AUTO, ON or OFF")
set_property(CACHE TESSERA_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(TESSERA_HAS_PYTHON OFF)

if(NOT TESSERA_PYTHON STREQUAL "OFF")
  # Debian's interpreter first: the one `make deps` gives python3-dev and python3-venv to.
  if(NOT DEFINED Python_EXECUTABLE AND EXISTS /usr/bin/python3 AND NOT SKBUILD)
    set(Python_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python 3.10 COMPONENTS Interpreter Development.Module)
  if(NOT Python_FOUND)
    tessera_feature_unavailable(TESSERA_PYTHON "Python package" "no Python >= 3.10 with its headers (Debian: python3-dev)")
  else()
    # nanobind from the interpreter that builds us (pip install .), else from the venv.
    execute_process(COMMAND ${Python_EXECUTABLE} -m nanobind --cmake_dir OUTPUT_VARIABLE nanobind_dir
                    OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE nanobind_rc ERROR_QUIET)
    set(TESSERA_PYTHON_TEST_EXECUTABLE "")
    if(NOT nanobind_rc EQUAL 0 OR NOT SKBUILD)
      file(READ ${CMAKE_SOURCE_DIR}/python/requirements-build.txt build_pins)
      file(READ ${CMAKE_SOURCE_DIR}/python/requirements-test.txt test_pins)
      string(SHA256 pins_hash "${Python_VERSION}${build_pins}${test_pins}")
      string(SUBSTRING "${pins_hash}" 0 12 pins_hash)
      if(DEFINED ENV{HOME})
        set(venv_default "$ENV{HOME}/.cache/tessera/python-venv-${pins_hash}")
      else()
        set(venv_default "${CMAKE_BINARY_DIR}/python-venv-${pins_hash}")
      endif()
      set(TESSERA_PYTHON_VENV "${venv_default}" CACHE PATH "The venv with nanobind and the Python tests' packages")
      set(venv_python "${TESSERA_PYTHON_VENV}/bin/python")
      set(stamp "${TESSERA_PYTHON_VENV}/.tessera-installed")
      if(NOT EXISTS "${stamp}")
        message(STATUS "tessera: creating ${TESSERA_PYTHON_VENV} (nanobind, NumPy, ml_dtypes, pytest from PyPI)")
        execute_process(COMMAND ${Python_EXECUTABLE} -m venv --clear "${TESSERA_PYTHON_VENV}" RESULT_VARIABLE venv_rc
                        OUTPUT_VARIABLE venv_err ERROR_VARIABLE venv_err)
        if(venv_rc EQUAL 0)
          execute_process(COMMAND "${venv_python}" -m pip install --quiet --disable-pip-version-check -r
                                  ${CMAKE_SOURCE_DIR}/python/requirements-build.txt -r
                                  ${CMAKE_SOURCE_DIR}/python/requirements-test.txt RESULT_VARIABLE venv_rc
                          OUTPUT_VARIABLE venv_err ERROR_VARIABLE venv_err)
        endif()
        if(venv_rc EQUAL 0)
          file(WRITE "${stamp}" "${build_pins}${test_pins}")
        endif()
      endif()
      if(EXISTS "${stamp}")
        execute_process(COMMAND "${venv_python}" -m nanobind --cmake_dir OUTPUT_VARIABLE nanobind_dir
                        OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE nanobind_rc ERROR_QUIET)
        set(TESSERA_PYTHON_TEST_EXECUTABLE "${venv_python}")
      else()
        set(nanobind_rc 1)
        string(STRIP "${venv_err}" venv_err)
        tessera_feature_unavailable(TESSERA_PYTHON "Python package" "could not make the venv ${TESSERA_PYTHON_VENV} "
                                   "(Debian: python3-venv; PyPI must be reachable; exit status ${venv_rc}): ${venv_err}")
      endif()
    endif()
    if(nanobind_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${nanobind_dir}")
      find_package(nanobind CONFIG REQUIRED)
      set(TESSERA_HAS_PYTHON ON)
      set(CMAKE_POSITION_INDEPENDENT_CODE ON)
      add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-fno-semantic-interposition>)
      message(STATUS "tessera: Python package on (Python ${Python_VERSION}, nanobind ${nanobind_VERSION})")
    endif()
  endif()
endif()
