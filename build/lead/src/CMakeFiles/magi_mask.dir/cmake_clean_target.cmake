file(REMOVE_RECURSE
  "libmagi_mask.a"
)
