file(REMOVE_RECURSE
  "libmagi_kernels.a"
)
