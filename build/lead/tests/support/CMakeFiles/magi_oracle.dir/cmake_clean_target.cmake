file(REMOVE_RECURSE
  "libmagi_oracle.a"
)
