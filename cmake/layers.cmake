# The layers of tessera, lowest first (docs/architecture.md draws them).
#
# A layer is a set of folders (under include/tessera/ and src/; a folder's sub-folders
# belong to it unless a layer names them) and the layers it builds on. A file may include
# headers of its own layer and of the layers below it (DEPS, transitively), never above:
# cmake/check_layers.cmake checks every quoted #include on each build and in `make test`,
# and prints the graph. Each layer lives in one library (LIBRARY), and a library links
# exactly the libraries of its layers' DEPS, so the link graph is the layer graph.
#
#   tessera_layer(NAME LIBRARY lib DIRS folder... [DEPS layer...])

set_property(GLOBAL PROPERTY TESSERA_LAYER_NAMES "")

function(tessera_layer name)
  cmake_parse_arguments(L "" "LIBRARY" "DIRS;DEPS" ${ARGN})
  set_property(GLOBAL APPEND PROPERTY TESSERA_LAYER_NAMES ${name})
  set_property(GLOBAL PROPERTY TESSERA_LAYER_${name}_LIBRARY ${L_LIBRARY})
  set_property(GLOBAL PROPERTY TESSERA_LAYER_${name}_DIRS ${L_DIRS})
  set_property(GLOBAL PROPERTY TESSERA_LAYER_${name}_DEPS ${L_DEPS})
endfunction()

# Runtime foundations: dtypes, shapes, errors, threads, allocator, files, JSON fields.
tessera_layer(base LIBRARY tessera_base DIRS base)
# Raw-pointer kernels (no Array, no framework types).
tessera_layer(cpu_kernels LIBRARY tessera_cpu_kernels DIRS backend/cpu/kernels DEPS base)
tessera_layer(cuda_kernels LIBRARY tessera_cuda_kernels DIRS backend/cuda/kernels DEPS base)
# The primitive interface and the primitive families' declarations.
tessera_layer(ir LIBRARY tessera_core DIRS ir DEPS base)
# Array, ops, transforms (grad, vmap), trees, the primitives' rules.
tessera_layer(core LIBRARY tessera_core DIRS core DEPS ir cpu_kernels)
# Each primitive family's eval_cpu (calls the CPU kernels).
tessera_layer(backend_cpu LIBRARY tessera_core DIRS backend/cpu DEPS core)
# Graphs, passes, memory planning, Executables, the compilation cache.
tessera_layer(compiler LIBRARY tessera_compiler DIRS compiler DEPS backend_cpu)
# SPMD: meshes, shardings, rules, the partitioner, communicators (in-process, TCP, MPI, NCCL).
tessera_layer(spmd LIBRARY tessera_spmd DIRS spmd DEPS compiler cuda_kernels)
# The GPU runtime and its executable (or, without CUDA, the stand-in that says why not).
tessera_layer(backend_cuda LIBRARY tessera_backend_cuda DIRS backend backend/cuda backend/no_cuda
              DEPS compiler cuda_kernels spmd)
# The user API: jit over the compiler, the partitioner and the devices; tessera.h.
tessera_layer(api LIBRARY tessera DIRS api . DEPS spmd backend_cuda)
# The trainer's layers.
tessera_layer(goodput LIBRARY tessera_goodput DIRS goodput DEPS base)
tessera_layer(nn LIBRARY tessera_nn DIRS nn DEPS api)
tessera_layer(models LIBRARY tessera_models DIRS models DEPS nn)
tessera_layer(optim LIBRARY tessera_optim DIRS optim DEPS nn)
tessera_layer(data LIBRARY tessera_data DIRS data DEPS api)
tessera_layer(ckpt LIBRARY tessera_ckpt DIRS ckpt DEPS api)
tessera_layer(interop LIBRARY tessera_interop DIRS interop DEPS models optim data ckpt)
tessera_layer(train LIBRARY tessera_train DIRS train DEPS interop goodput)
tessera_layer(launch LIBRARY tessera_launch DIRS launch DEPS goodput)
tessera_layer(plan LIBRARY tessera_plan DIRS plan DEPS train)
tessera_layer(cli LIBRARY tessera_cli DIRS cli DEPS plan launch)

# Links `library` to the libraries of its layers' DEPS (PUBLIC: headers of a layer
# include its dependencies' headers).
function(tessera_link_layers library)
  get_property(names GLOBAL PROPERTY TESSERA_LAYER_NAMES)
  set(links "")
  foreach(name ${names})
    get_property(owner GLOBAL PROPERTY TESSERA_LAYER_${name}_LIBRARY)
    if(NOT owner STREQUAL library)
      continue()
    endif()
    get_property(deps GLOBAL PROPERTY TESSERA_LAYER_${name}_DEPS)
    foreach(dep ${deps})
      get_property(dep_library GLOBAL PROPERTY TESSERA_LAYER_${dep}_LIBRARY)
      if(NOT dep_library STREQUAL library AND TARGET ${dep_library})
        list(APPEND links ${dep_library})
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES links)
  get_target_property(type ${library} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_link_libraries(${library} PRIVATE ${links})
  else()
    target_link_libraries(${library} PUBLIC ${links})
  endif()
endfunction()

# The table as a file cmake/check_layers.cmake reads: one line per layer,
# "name|dir,dir|dep,dep".
function(tessera_write_layer_table path)
  get_property(names GLOBAL PROPERTY TESSERA_LAYER_NAMES)
  set(text "")
  foreach(name ${names})
    get_property(dirs GLOBAL PROPERTY TESSERA_LAYER_${name}_DIRS)
    get_property(deps GLOBAL PROPERTY TESSERA_LAYER_${name}_DEPS)
    string(REPLACE ";" "," dirs "${dirs}")
    string(REPLACE ";" "," deps "${deps}")
    string(APPEND text "${name}|${dirs}|${deps}\n")
  endforeach()
  file(WRITE ${path}.tmp "${text}")
  file(COPY_FILE ${path}.tmp ${path} ONLY_IF_DIFFERENT)
endfunction()
