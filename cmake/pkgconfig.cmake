# rnncore.pc for projects that link without CMake:
#   c++ -std=c++17 app.cpp $(pkg-config --cflags --libs rnncore)
# The library is static, so its own dependencies (BLAS, threads, Apple frameworks) are in
# Libs rather than Libs.private: pkg-config --libs without --static must give a full link.
function(rnncore_install_pkgconfig)
  set(libs "")
  if(RNNCORE_BLAS STREQUAL "openblas")
    foreach(lib IN LISTS BLAS_LIBRARIES)
      if(lib MATCHES "^-")
        list(APPEND libs "${lib}")
      else()
        list(APPEND libs "\"${lib}\"")
      endif()
    endforeach()
  elseif(RNNCORE_BLAS STREQUAL "accelerate")
    list(APPEND libs "-framework Accelerate")
  endif()
  if(RNNCORE_METAL_ENABLED)
    list(APPEND libs "-framework Metal" "-framework Foundation" "-framework CoreGraphics")
  endif()
  list(APPEND libs "-pthread")
  list(JOIN libs " " RNNCORE_PC_LIBS)
  # Relative to the .pc file, so the installed tree can be moved.
  file(RELATIVE_PATH up "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
  string(REGEX REPLACE "/$" "" up "${up}")
  set(RNNCORE_PC_PREFIX "\${pcfiledir}/${up}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/rnncore.pc.in
                 ${CMAKE_CURRENT_BINARY_DIR}/rnncore.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/rnncore.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endfunction()
