# SPDX-License-Identifier: MIT
# Findhiredis.cmake - finds hiredis (Debian: libhiredis-dev) and gives it as
# the imported target hiredis::hiredis, the name hiredis's own CMake package
# uses, so a project that already found hiredis that way keeps its target.
#
# tollgate's build uses it, and installs it beside tollgateConfig.cmake: the
# exported static library then names hiredis::hiredis, resolved where the
# package is used, instead of the absolute path of the build machine's
# libhiredis. Debian's hiredis 0.14 ships a pkg-config file but no CMake
# target, hence this module.
#
# Sets hiredis_FOUND, HIREDIS_INCLUDE_DIR (the directory holding hiredis/)
# and HIREDIS_LIBRARY.
if(TARGET hiredis::hiredis)
  set(hiredis_FOUND TRUE)
  return()
endif()

find_path(HIREDIS_INCLUDE_DIR hiredis/hiredis.h)
find_library(HIREDIS_LIBRARY hiredis)

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(hiredis
  REQUIRED_VARS HIREDIS_LIBRARY HIREDIS_INCLUDE_DIR)

if(hiredis_FOUND AND NOT TARGET hiredis::hiredis)
  add_library(hiredis::hiredis UNKNOWN IMPORTED)
  set_target_properties(hiredis::hiredis PROPERTIES
    IMPORTED_LOCATION "${HIREDIS_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${HIREDIS_INCLUDE_DIR}")
endif()
mark_as_advanced(HIREDIS_INCLUDE_DIR HIREDIS_LIBRARY)
