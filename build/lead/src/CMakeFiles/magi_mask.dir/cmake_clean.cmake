file(REMOVE_RECURSE
  "CMakeFiles/magi_mask.dir/mask/builders.cc.o"
  "CMakeFiles/magi_mask.dir/mask/builders.cc.o.d"
  "CMakeFiles/magi_mask.dir/mask/dense.cc.o"
  "CMakeFiles/magi_mask.dir/mask/dense.cc.o.d"
  "CMakeFiles/magi_mask.dir/mask/doc_lengths.cc.o"
  "CMakeFiles/magi_mask.dir/mask/doc_lengths.cc.o.d"
  "CMakeFiles/magi_mask.dir/mask/families.cc.o"
  "CMakeFiles/magi_mask.dir/mask/families.cc.o.d"
  "CMakeFiles/magi_mask.dir/mask/json.cc.o"
  "CMakeFiles/magi_mask.dir/mask/json.cc.o.d"
  "CMakeFiles/magi_mask.dir/mask/mask.cc.o"
  "CMakeFiles/magi_mask.dir/mask/mask.cc.o.d"
  "libmagi_mask.a"
  "libmagi_mask.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang CXX)
  include(CMakeFiles/magi_mask.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
