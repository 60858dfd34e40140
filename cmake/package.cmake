# The CMake package for C++ users: `cmake --install <build> --component magiattn_cxx --prefix P`
# puts the headers (include/magi), the static libraries and lib/cmake/magiattn there, and then
#   find_package(magiattn REQUIRED)            # with CMAKE_PREFIX_PATH=P
#   target_link_libraries(app PRIVATE magiattn::magiattn)
# gives masks, attention (CPU and, where built, the sm90 kernels) and planning; and
#   magiattn::runtime   the distributed runtime over any magi::comm::Communicator (runtime.h)
#   magiattn::mpi       the MPI communicator ("mpi_communicator.h"), where MPI was found
#   magiattn::nccl      the NCCL communicator (magi/nccl.h), in CUDA builds with NCCL's header
# (examples/cpp). The component is left out of a plain install (the Python wheel's).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(magi_package_targets magi_core magi_mask magi_kernels magi_plan magi_comm magi_runtime)
if(TARGET magi_cpu_avx512)
  list(APPEND magi_package_targets magi_cpu_avx512)
endif()
if(TARGET magi_cpu_amx)
  list(APPEND magi_package_targets magi_cpu_amx)
endif()
set_target_properties(magi_runtime PROPERTIES EXPORT_NAME runtime)
set(MAGI_PACKAGE_MPI OFF)
if(TARGET magi_comm_mpi)
  list(APPEND magi_package_targets magi_comm_mpi)
  set_target_properties(magi_comm_mpi PROPERTIES EXPORT_NAME mpi)
  set(MAGI_PACKAGE_MPI ON)
  install(FILES ${PROJECT_SOURCE_DIR}/src/comm/mpi/mpi_communicator.h
          DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/magi/mpi COMPONENT magiattn_cxx EXCLUDE_FROM_ALL)
endif()
set(MAGI_PACKAGE_NCCL OFF)
if(TARGET magi_comm_nccl)
  list(APPEND magi_package_targets magi_comm_nccl)
  set_target_properties(magi_comm_nccl PROPERTIES EXPORT_NAME nccl)
  set(MAGI_PACKAGE_NCCL ON)
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
