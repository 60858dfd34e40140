src/CMakeFiles/magi_mask.dir/mask/dense.cc.o: \
 /work/main/src/mask/dense.cc /usr/include/stdc-predef.h
