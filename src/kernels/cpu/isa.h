// The namespace of one compilation of the CPU backend. A portable build (MAGI_CPU_ARCH
// x86-64-v3, src/CMakeLists.txt) compiles forward.cc, backward.cc and work.cc twice: once into
// `base` with the build's -march, once into `avx512` with -march=x86-64-v4; dispatch.cc picks
// one per call by what the CPU has. Distinct namespaces keep the two copies of every inline
// function and template of these files apart (the linker would otherwise keep one of them for
// both, and the AVX-512 one would fault on an AVX2 CPU).
#pragma once

#ifndef MAGI_CPU_NS
#define MAGI_CPU_NS base
#endif
