file(REMOVE_RECURSE
  "CMakeFiles/magi_test_seed.dir/seed.cc.o"
  "CMakeFiles/magi_test_seed.dir/seed.cc.o.d"
  "libmagi_test_seed.a"
  "libmagi_test_seed.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/magi_test_seed.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
