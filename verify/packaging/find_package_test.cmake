# ctest packaging_find_package: install the build tree (component devel: headers, libraries,
# OrthrosConfig.cmake) into WORK/prefix, then build and run examples/find_package_consumer with
# find_package(Orthros) from that prefix only. Arguments: BUILD_DIR SOURCE_DIR WORK CXX.
file(REMOVE_RECURSE ${WORK})
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "failed (${rc}): ${cmd}")
  endif()
endfunction()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/prefix --component devel)
foreach(f include/orthros/attention.hpp include/orthros/error.hpp include/orthros/check.hpp include/orthros/golden.hpp
          lib/liborthros_kit.a lib/cmake/Orthros/OrthrosConfig.cmake
          lib/cmake/Orthros/OrthrosConfigVersion.cmake lib/cmake/Orthros/OrthrosTargets.cmake)
  if(NOT EXISTS ${WORK}/prefix/${f})
    message(FATAL_ERROR "cmake --install did not install ${f}")
  endif()
endforeach()
# A C++14 consumer: orthros::reference's cxx_std_17 must raise the standard of its compile (the
# headers use std::is_same_v and if constexpr, which fail to compile as C++14).
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/examples/find_package_consumer -B ${WORK}/build
    -DCMAKE_PREFIX_PATH=${WORK}/prefix -DCMAKE_CXX_COMPILER=${CXX} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_CXX_STANDARD=14)
run(${CMAKE_COMMAND} --build ${WORK}/build)
run(${WORK}/build/orthros_consumer)
