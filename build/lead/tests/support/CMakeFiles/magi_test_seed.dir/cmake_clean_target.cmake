file(REMOVE_RECURSE
  "libmagi_test_seed.a"
)
