# Install rules and the exported CMake package, included last by the top-level CMakeLists.
#
# `cmake --install build --prefix PREFIX` installs
#   PREFIX/include/orthros/*.hpp              the header-only oracle (reference/include), the port
#                                             kit's headers (verify/kit/include) and, when built,
#                                             cuda/include
#   PREFIX/lib/liborthros_kit.a               the port kit (orthros::kit; orthros::io names it too)
#   PREFIX/lib/liborthros_cuda.a              the CUDA kernels, when built (orthros::cuda)
#   PREFIX/bin/orthros                        the command line tool                (component cli)
#   PREFIX/lib/cmake/Orthros/OrthrosConfig.cmake, OrthrosConfigVersion.cmake, OrthrosTargets.cmake
# so that a project does
#   find_package(Orthros 0.1 REQUIRED)                   # CMAKE_PREFIX_PATH=PREFIX
#   target_link_libraries(app PRIVATE orthros::reference)   # + orthros::cuda when Orthros_CUDA_FOUND
# (examples/find_package_consumer, tested by verify/packaging). Components: `devel` (headers,
# libraries, CMake package) and `cli` (bin/orthros).
#
# In a wheel build (`pip install .`, scikit-build-core sets SKBUILD) only component `python` is
# installed: the `orthros` command into the wheel's scripts (on PATH in the environment that
# installs it) and the extension module into the package (verify/python/CMakeLists.txt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

if(SKBUILD)
  install(TARGETS orthros RUNTIME DESTINATION ${SKBUILD_SCRIPTS_DIR} COMPONENT python)
  return()
endif()

set(ORTHROS_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/Orthros CACHE STRING
    "Where the Orthros CMake package (OrthrosConfig.cmake) is installed, relative to the prefix")

foreach(_dir reference/include/orthros verify/kit/include/orthros)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel FILES_MATCHING PATTERN "*.hpp")
endforeach()
set(_orthros_export_targets orthros_error orthros_reference orthros_kit orthros_io)

# orthros::cuda (cuda/CMakeLists.txt) names its include directories by source path; an exported
# target needs them split into the build tree's and the installed tree's.
if(TARGET orthros_cuda)
  get_target_property(_inc orthros_cuda INTERFACE_INCLUDE_DIRECTORIES)
  set(_fixed "")
  foreach(_d IN LISTS _inc)
    if(_d MATCHES "^\\$<" OR NOT IS_ABSOLUTE "${_d}")
      list(APPEND _fixed "${_d}")
    else()
      list(APPEND _fixed "$<BUILD_INTERFACE:${_d}>")
    endif()
  endforeach()
  list(APPEND _fixed "$<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>")
  set_property(TARGET orthros_cuda PROPERTY INTERFACE_INCLUDE_DIRECTORIES "${_fixed}")
  set_target_properties(orthros_cuda PROPERTIES EXPORT_NAME cuda)
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/cuda/include/
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel)
  list(APPEND _orthros_export_targets orthros_cuda)
  set(ORTHROS_CONFIG_HAS_CUDA ON)
else()
  set(ORTHROS_CONFIG_HAS_CUDA OFF)
endif()

install(TARGETS ${_orthros_export_targets} EXPORT OrthrosTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel)
install(EXPORT OrthrosTargets NAMESPACE orthros:: DESTINATION ${ORTHROS_INSTALL_CMAKEDIR} COMPONENT devel)
install(TARGETS orthros RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/OrthrosConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/OrthrosConfig.cmake INSTALL_DESTINATION ${ORTHROS_INSTALL_CMAKEDIR})
# 0.x: a minor version may change the API, so 0.1 accepts 0.1.*, not 0.2.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/OrthrosConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/OrthrosConfig.cmake ${PROJECT_BINARY_DIR}/cmake/OrthrosConfigVersion.cmake
        DESTINATION ${ORTHROS_INSTALL_CMAKEDIR} COMPONENT devel)
