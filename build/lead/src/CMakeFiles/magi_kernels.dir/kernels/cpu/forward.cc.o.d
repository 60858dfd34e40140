src/CMakeFiles/magi_kernels.dir/kernels/cpu/forward.cc.o: \
 /work/main/src/kernels/cpu/forward.cc /usr/include/stdc-predef.h
