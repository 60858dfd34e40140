
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/tests/unit/mask_test.cc" "tests/CMakeFiles/mask_test.dir/unit/mask_test.cc.o" "gcc" "tests/CMakeFiles/mask_test.dir/unit/mask_test.cc.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/lead/src/CMakeFiles/magi_kernels.dir/DependInfo.cmake"
  "/work/main/build/lead/tests/support/CMakeFiles/magi_oracle.dir/DependInfo.cmake"
  "/work/main/build/lead/tests/support/CMakeFiles/magi_test_seed.dir/DependInfo.cmake"
  "/work/main/build/lead/src/CMakeFiles/magi_mask.dir/DependInfo.cmake"
  "/work/main/build/lead/src/CMakeFiles/magi_core.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
