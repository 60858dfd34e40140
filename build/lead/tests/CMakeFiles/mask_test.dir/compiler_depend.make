# Empty compiler generated dependencies file for mask_test.
# This may be replaced when dependencies are built.
