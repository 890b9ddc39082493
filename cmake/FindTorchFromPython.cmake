# Locates the installed torch through the Python interpreter that builds us, without find_package(Torch):
# its CUDA detection is slow and fragile, and we only need headers, libraries and the C++ ABI flag. Defines
# the interface targets torch_cpp (torch's C++ libraries) and torch_python_bindings (with torch_python).
find_package(Python3 REQUIRED COMPONENTS Interpreter Development.Module)

execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(int(torch.version.cuda is not None)); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _torch_info
  RESULT_VARIABLE _torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "torch_fl builds against an installed torch (2.11 to 2.13), and `import torch` failed with ${Python3_EXECUTABLE}. Install torch first (e.g. pip install torch==2.13.0), then pip install --no-build-isolation -e .")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 FLAGOS_TORCH_DIR)
list(GET _torch_info 1 FLAGOS_TORCH_VERSION)
list(GET _torch_info 2 _torch_cxx11_abi)
list(GET _torch_info 3 FLAGOS_TORCH_HAS_CUDA)
set(FLAGOS_TORCH_LIB_DIR ${FLAGOS_TORCH_DIR}/lib)
message(STATUS "torch_fl: building against torch ${FLAGOS_TORCH_VERSION} at ${FLAGOS_TORCH_DIR} (CUDA: ${FLAGOS_TORCH_HAS_CUDA})")

# torch's C++ libraries, without Python: what the core library (runtime, ops, distributed, extension API) and
# C++ programs over it link.
add_library(torch_cpp INTERFACE)
target_include_directories(torch_cpp SYSTEM INTERFACE
  ${FLAGOS_TORCH_DIR}/include ${FLAGOS_TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(torch_cpp INTERFACE _GLIBCXX_USE_CXX11_ABI=${_torch_cxx11_abi})
set(_torch_libs c10 torch_cpu torch)
if(FLAGOS_TORCH_HAS_CUDA)
  list(APPEND _torch_libs c10_cuda torch_cuda)
  find_package(CUDAToolkit REQUIRED)
  target_link_libraries(torch_cpp INTERFACE CUDA::cudart)
endif()
foreach(_lib ${_torch_libs} torch_python)
  find_library(FLAGOS_TORCH_LIB_${_lib} NAMES ${_lib} PATHS ${FLAGOS_TORCH_LIB_DIR} NO_DEFAULT_PATH REQUIRED)
endforeach()
foreach(_lib ${_torch_libs})
  target_link_libraries(torch_cpp INTERFACE ${FLAGOS_TORCH_LIB_${_lib}})
endforeach()

# The same plus torch's Python bindings: what the extension module torch_fl._C links.
add_library(torch_python_bindings INTERFACE)
target_link_libraries(torch_python_bindings INTERFACE torch_cpp ${FLAGOS_TORCH_LIB_torch_python})
