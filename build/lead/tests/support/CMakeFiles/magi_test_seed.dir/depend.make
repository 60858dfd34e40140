# Empty dependencies file for magi_test_seed.
# This may be replaced when dependencies are built.
