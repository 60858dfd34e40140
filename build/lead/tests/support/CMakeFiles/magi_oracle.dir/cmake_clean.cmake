file(REMOVE_RECURSE
  "CMakeFiles/magi_oracle.dir/oracle.cc.o"
  "CMakeFiles/magi_oracle.dir/oracle.cc.o.d"
  "libmagi_oracle.a"
  "libmagi_oracle.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/magi_oracle.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
