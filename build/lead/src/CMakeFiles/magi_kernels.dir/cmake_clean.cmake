file(REMOVE_RECURSE
  "CMakeFiles/magi_kernels.dir/kernels/attention.cc.o"
  "CMakeFiles/magi_kernels.dir/kernels/attention.cc.o.d"
  "CMakeFiles/magi_kernels.dir/kernels/cpu/backward.cc.o"
  "CMakeFiles/magi_kernels.dir/kernels/cpu/backward.cc.o.d"
  "CMakeFiles/magi_kernels.dir/kernels/cpu/forward.cc.o"
  "CMakeFiles/magi_kernels.dir/kernels/cpu/forward.cc.o.d"
  "libmagi_kernels.a"
  "libmagi_kernels.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/magi_kernels.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
