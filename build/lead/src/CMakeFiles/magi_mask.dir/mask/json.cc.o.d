src/CMakeFiles/magi_mask.dir/mask/json.cc.o: /work/main/src/mask/json.cc \
 /usr/include/stdc-predef.h
