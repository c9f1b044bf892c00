# Runs cmake/metal.cmake's rnncore_metal_enabled() alone, as CMakeLists.txt does, for
# tests/apple_host/check.py:
#   cmake -DMODE=AUTO -DAPPLE=TRUE -DRNNCORE_XCRUN=<xcrun> -P metal_enabled.cmake
# prints ENABLED=<TRUE|FALSE> and REASON=<why it is off>.
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/metal.cmake)
rnncore_metal_enabled("${MODE}" "${APPLE}" enabled reason)
message("ENABLED=${enabled}")
message("REASON=${reason}")
