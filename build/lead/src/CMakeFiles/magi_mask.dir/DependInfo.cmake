
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/src/mask/builders.cc" "src/CMakeFiles/magi_mask.dir/mask/builders.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/builders.cc.o.d"
  "/work/main/src/mask/dense.cc" "src/CMakeFiles/magi_mask.dir/mask/dense.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/dense.cc.o.d"
  "/work/main/src/mask/doc_lengths.cc" "src/CMakeFiles/magi_mask.dir/mask/doc_lengths.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/doc_lengths.cc.o.d"
  "/work/main/src/mask/families.cc" "src/CMakeFiles/magi_mask.dir/mask/families.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/families.cc.o.d"
  "/work/main/src/mask/json.cc" "src/CMakeFiles/magi_mask.dir/mask/json.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/json.cc.o.d"
  "/work/main/src/mask/mask.cc" "src/CMakeFiles/magi_mask.dir/mask/mask.cc.o" "gcc" "src/CMakeFiles/magi_mask.dir/mask/mask.cc.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  "/work/main/build/lead/src/CMakeFiles/magi_core.dir/DependInfo.cmake"
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
