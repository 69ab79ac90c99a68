# Feature variants: the build a user gets without MPI (or without NCCL, or with a compiler
# that lacks the AVX-512 kernels' targets) compiles too.
#
# A user without OpenMPI (or with -DTESSERA_ENABLE_MPI=OFF), or with CUDA but no NCCL,
# compiles the `#if !TESSERA_HAS_MPI` / `!TESSERA_HAS_NCCL` branches that our own
# machines never see. Rather than a third full build tree, this compiles again only the
# sources whose preprocessing depends on a feature this build has, with that feature
# switched off, under the owning target's own include paths, definitions and warning
# flags (warnings are errors). The CUDA-absent build is the sanitizer tree `make test`
# builds, so CUDA needs no variant here.
#
# A source depends on feature F when it names TESSERA_HAS_F outside a comment, or includes (by its quoted
# path) a header under src/ or include/ that does; one level of inclusion is enough for
# today's tree, where those headers are included directly by the .cpp files.
#
# The objects are built by the `tessera_feature_variants` target (part of the default
# build, and a dependency of `tessera_tests`); nothing links them.

add_custom_target(tessera_feature_variants ALL)

# Headers (as include paths) that name TESSERA_HAS_<feature>.
function(tessera_headers_naming feature out)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/*.h ${CMAKE_SOURCE_DIR}/include/*.h)
  set(found "")
  foreach(header ${headers})
    file(STRINGS ${header} hits REGEX "^[^/]*TESSERA_HAS_${feature}")
    if(hits)
      file(RELATIVE_PATH rel ${CMAKE_SOURCE_DIR} ${header})
      string(REGEX REPLACE "^(src|include)/" "" rel "${rel}")
      list(APPEND found "${rel}")
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# Compiles the C++ sources of `owner` that depend on `feature` with TESSERA_HAS_<feature>=0;
# `headers` (a list) are the headers that name it.
function(tessera_variant_without feature owner headers)
  get_target_property(sources ${owner} SOURCES)
  get_target_property(source_dir ${owner} SOURCE_DIR)
  set(dependent "")
  foreach(source ${sources})
    if(NOT source MATCHES "\\.cpp$")
      continue()
    endif()
    if(NOT IS_ABSOLUTE "${source}")
      set(source "${source_dir}/${source}")
    endif()
    file(STRINGS ${source} hits REGEX "^[^/]*TESSERA_HAS_${feature}")
    if(NOT hits)
      file(STRINGS ${source} includes REGEX "^#include \"")
      foreach(line ${includes})
        string(REGEX REPLACE "^#include \"([^\"]*)\".*" "\\1" included "${line}")
        if(included IN_LIST headers)
          set(hits ON)
        endif()
      endforeach()
    endif()
    if(hits)
      list(APPEND dependent ${source})
    endif()
  endforeach()
  if(NOT dependent)
    return()
  endif()
  set(name variant_${owner}_without_${feature})
  add_library(${name} OBJECT EXCLUDE_FROM_ALL ${dependent})
  # The owner's transitive include paths, definitions and options, with the feature off.
  set_target_properties(
    ${name}
    PROPERTIES INCLUDE_DIRECTORIES "$<TARGET_PROPERTY:${owner},INCLUDE_DIRECTORIES>"
               COMPILE_DEFINITIONS
               "$<FILTER:$<TARGET_PROPERTY:${owner},COMPILE_DEFINITIONS>,EXCLUDE,^TESSERA_HAS_${feature}=>;TESSERA_HAS_${feature}=0"
               COMPILE_OPTIONS "$<TARGET_PROPERTY:${owner},COMPILE_OPTIONS>")
  # Generated headers and link-time usage requirements of the owner come first.
  add_dependencies(${name} ${owner})
  add_dependencies(tessera_feature_variants ${name})
  list(LENGTH dependent count)
  message(STATUS "tessera: ${name}: ${count} source(s) compiled again with TESSERA_HAS_${feature}=0")
endfunction()

# For every library and executable of this directory.
function(tessera_add_feature_variants)
  get_property(targets DIRECTORY ${CMAKE_SOURCE_DIR} PROPERTY BUILDSYSTEM_TARGETS)
  set(owners "")
  foreach(target ${targets})
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "STATIC_LIBRARY" OR type STREQUAL "EXECUTABLE")
      list(APPEND owners ${target})
    endif()
  endforeach()
  foreach(feature MPI NCCL AVX512_KERNELS)
    if(TESSERA_HAS_${feature})
      tessera_headers_naming(${feature} headers)
      foreach(owner ${owners})
        tessera_variant_without(${feature} ${owner} "${headers}")
      endforeach()
    endif()
  endforeach()
endfunction()

tessera_add_feature_variants()
if(TARGET tessera_tests)
  add_dependencies(tessera_tests tessera_feature_variants)
endif()
