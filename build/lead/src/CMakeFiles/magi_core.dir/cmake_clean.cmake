file(REMOVE_RECURSE
  "CMakeFiles/magi_core.dir/core/dtype.cc.o"
  "CMakeFiles/magi_core.dir/core/dtype.cc.o.d"
  "CMakeFiles/magi_core.dir/core/tensor.cc.o"
  "CMakeFiles/magi_core.dir/core/tensor.cc.o.d"
  "libmagi_core.a"
  "libmagi_core.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/magi_core.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
