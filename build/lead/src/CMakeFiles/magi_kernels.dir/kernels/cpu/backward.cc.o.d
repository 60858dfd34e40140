src/CMakeFiles/magi_kernels.dir/kernels/cpu/backward.cc.o: \
 /work/main/src/kernels/cpu/backward.cc /usr/include/stdc-predef.h
