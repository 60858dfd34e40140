# Header-only dependencies taken from their PyPI wheels, so that a build needs no system package
# (`pip install .` in a venv or conda env, a container without apt): the pinned wheel is
# downloaded with its SHA-256 checked, or taken from a local copy for machines without network
# (cache variable or environment variable MAGI_<NAME>_WHEEL, checked against the same hash),
# and the headers under `subdir` of the wheel are unpacked once into MAGI_DEPS_DIR (default
# build/_deps of the source tree, shared by every build directory of a checkout).
#
#   magi_wheel_headers(<NAME> <wheel file name> <url> <sha256> <subdir in the wheel> <out var>)
#
# sets <out var> to the unpacked include directory.
set(MAGI_DEPS_DIR "${CMAKE_CURRENT_LIST_DIR}/../build/_deps" CACHE PATH
    "Where the dependency wheels are kept and unpacked")
function(magi_wheel_headers name file url sha256 subdir out)
  set(dest "${MAGI_DEPS_DIR}/${file}.d")
  if(NOT EXISTS "${dest}/${subdir}")
    set(wheel "${MAGI_${name}_WHEEL}")
    if(NOT wheel AND DEFINED ENV{MAGI_${name}_WHEEL})
      set(wheel "$ENV{MAGI_${name}_WHEEL}")
    endif()
    if(wheel)
      if(NOT EXISTS "${wheel}")
        message(FATAL_ERROR "magiattn: MAGI_${name}_WHEEL=${wheel} does not exist")
      endif()
      file(SHA256 "${wheel}" got)
      if(NOT got STREQUAL sha256)
        message(FATAL_ERROR "magiattn: ${wheel} has SHA-256 ${got}, not the pinned ${file} "
                            "(${sha256})")
      endif()
    else()
      set(wheel "${MAGI_DEPS_DIR}/${file}")
      message(STATUS "magiattn: downloading ${file}")
      file(DOWNLOAD "${url}" "${wheel}" STATUS status TLS_VERIFY ON)
      list(GET status 0 code)
      if(NOT code EQUAL 0)
        list(GET status 1 why)
        file(REMOVE "${wheel}")
        message(FATAL_ERROR "magiattn: could not download ${url} (${why}). Without network, "
                            "fetch ${file} elsewhere (pip download --no-deps) and set "
                            "MAGI_${name}_WHEEL to its path")
      endif()
      file(SHA256 "${wheel}" got)
      if(NOT got STREQUAL sha256)
        file(REMOVE "${wheel}")
        message(FATAL_ERROR "magiattn: ${url} has SHA-256 ${got}, not the pinned ${sha256}")
      endif()
    endif()
    file(ARCHIVE_EXTRACT INPUT "${wheel}" DESTINATION "${dest}" PATTERNS "${subdir}/*")
    if(NOT EXISTS "${dest}/${subdir}")
      message(FATAL_ERROR "magiattn: ${wheel} has no ${subdir}")
    endif()
  endif()
  set(${out} "${dest}/${subdir}" PARENT_SCOPE)
endfunction()
