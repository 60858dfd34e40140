file(REMOVE_RECURSE
  "libmagi_core.a"
)
