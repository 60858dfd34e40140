src/CMakeFiles/magi_kernels.dir/kernels/attention.cc.o: \
 /work/main/src/kernels/attention.cc /usr/include/stdc-predef.h
