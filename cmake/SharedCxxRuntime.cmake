# Make sure every library we build uses the process's shared C++ runtime (libstdc++.so.6).
#
# Some images ship libstdc++.so.6 without the `libstdc++.so` development link. g++ then silently links
# libstdc++.a into each shared library, and the process ends up with two C++ runtimes: ours exports its
# own copies of std:: symbols, and the first std::ostream use on an error path (c10::str building a
# TORCH_CHECK message) crashes on locale state the other runtime owns. Seen on the GPU machine (Ubuntu
# 24.04, gcc 13). Naming the shared runtime explicitly, ahead of g++'s implicit -lstdc++, fixes it.
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT APPLE)
  execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
    OUTPUT_VARIABLE _flagos_stdcxx_dev OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT IS_ABSOLUTE "${_flagos_stdcxx_dev}" OR NOT EXISTS "${_flagos_stdcxx_dev}")
    execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so.6
      OUTPUT_VARIABLE _flagos_stdcxx_runtime OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(IS_ABSOLUTE "${_flagos_stdcxx_runtime}" AND EXISTS "${_flagos_stdcxx_runtime}")
      get_filename_component(_flagos_stdcxx_runtime "${_flagos_stdcxx_runtime}" REALPATH)
      message(STATUS "torch_fl: no libstdc++.so link for ${CMAKE_CXX_COMPILER}; linking ${_flagos_stdcxx_runtime}")
      link_libraries("${_flagos_stdcxx_runtime}")
    else()
      message(FATAL_ERROR "torch_fl: the C++ compiler finds neither libstdc++.so nor libstdc++.so.6; a "
        "static C++ runtime inside the extension would crash next to torch's. Install libstdc++-dev.")
    endif()
  endif()
endif()
