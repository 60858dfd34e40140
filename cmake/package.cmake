# The CMake package for C++ users: `cmake --install <build> --component magiattn_cxx --prefix P`
# puts the headers (include/magi), the static libraries and lib/cmake/magiattn there, and then
#   find_package(magiattn REQUIRED)            # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE magiattn::magiattn)
# gives masks, attention (CPU and, where built, the sm90 kernels) and planning
# (examples/cpp). The component is left out of a plain install (the Python wheel's).
# Not in it yet: the distributed runtime and the MPI communicator.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(magi_package_targets magi_core magi_mask magi_kernels magi_plan)
if(TARGET magi_cpu_avx512)
  list(APPEND magi_package_targets magi_cpu_avx512)
endif()
add_library(magi_package INTERFACE)
set_target_properties(magi_package PROPERTIES EXPORT_NAME magiattn)
target_link_libraries(magi_package INTERFACE magi_kernels magi_plan)

set(magi_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/magiattn)
install(TARGETS ${magi_package_targets} magi_package EXPORT magiattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT magiattn_cxx EXCLUDE_FROM_ALL
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/magi DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT magiattn_cxx EXCLUDE_FROM_ALL)
install(EXPORT magiattnTargets NAMESPACE magiattn:: DESTINATION ${magi_cmake_dir}
        COMPONENT magiattn_cxx EXCLUDE_FROM_ALL)
set(MAGI_PACKAGE_CUDA ${MAGI_ENABLE_CUDA})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/magiattnConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/magiattnConfig.cmake
                              INSTALL_DESTINATION ${magi_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/magiattnConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/magiattnConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/magiattnConfigVersion.cmake
        DESTINATION ${magi_cmake_dir} COMPONENT magiattn_cxx EXCLUDE_FROM_ALL)
