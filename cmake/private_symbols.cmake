# Combines OBJECTS into one relocatable object, OUTPUT, in which every global symbol that is
# not rnncore's (its name contains "rnncore") is local. For the Metal host code
# (cmake/metal.cmake): metal-cpp's implementation tables stay private to rnncore, so an
# application that defines them for its own metal-cpp links with rnncore's static library.
#
#   cmake -DOBJECTS=a.o|b.o -DOUTPUT=out.o -DFORMAT=MACHO|ELF -DCXX=<c++> [-DLINK_FLAGS=f|g]
#         -DNM=<nm> [-DOBJCOPY=<objcopy>] -P private_symbols.cmake
#
# Mach-O: `ld -r -unexported_symbols_list` (through the compiler driver) turns the listed
# symbols into static ones (ld -r does so with every private extern it does not keep).
# ELF (the Linux check of this build): `objcopy --localize-symbols`. On ELF, weak and unique
# definitions (inline functions, templates: COMDAT members) are left alone: duplicates of them
# never clash, and localizing a COMDAT member would break it. Then checks the result: no
# global symbol left that is not rnncore's, and rnncore's own still global.
foreach(var OBJECTS OUTPUT FORMAT CXX NM)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "private_symbols.cmake needs -D${var}=...")
  endif()
endforeach()
string(REPLACE "|" ";" objects "${OBJECTS}")
string(REPLACE "|" ";" link_flags "${LINK_FLAGS}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "private_symbols.cmake: `${command}` failed (${rc}):\n${out}${err}")
  endif()
endfunction()

# Global symbols defined in <file>, as <out_foreign> (not rnncore's) and <out_own>.
function(global_symbols file out_foreign out_own)
  execute_process(COMMAND ${NM} -g ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE text
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "private_symbols.cmake: ${NM} -g ${file} failed (${rc}): ${err}")
  endif()
  string(REPLACE "\n" ";" lines "${text}")
  set(foreign)
  set(own)
  foreach(line IN LISTS lines)
    # "<address> <type> <name>"; undefined symbols have no address.
    if(NOT line MATCHES "^[0-9a-fA-F]+ ([A-Za-z]) (.+)$")
      continue()
    endif()
    set(type ${CMAKE_MATCH_1})
    set(name ${CMAKE_MATCH_2})
    if(FORMAT STREQUAL "ELF" AND type MATCHES "^[VWvwu]$")
      continue()
    endif()
    if(name MATCHES "rnncore")
      list(APPEND own ${name})
    else()
      list(APPEND foreign ${name})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES foreign)
  list(REMOVE_DUPLICATES own)
  list(SORT own)
  set(${out_foreign} ${foreign} PARENT_SCOPE)
  set(${out_own} ${own} PARENT_SCOPE)
endfunction()

set(combined ${OUTPUT}.combined.o)
set(list_file ${OUTPUT}.local.txt)
file(REMOVE ${OUTPUT})
run(${CXX} ${link_flags} -r -nostdlib ${objects} -o ${combined})
global_symbols(${combined} foreign own)
list(LENGTH foreign count)
string(REPLACE ";" "\n" listing "${foreign}")
file(WRITE ${list_file} "${listing}\n")

if(FORMAT STREQUAL "MACHO")
  run(${CXX} ${link_flags} -r -nostdlib -Wl,-unexported_symbols_list,${list_file} ${combined}
      -o ${OUTPUT})
elseif(FORMAT STREQUAL "ELF")
  if(NOT OBJCOPY)
    message(FATAL_ERROR "private_symbols.cmake needs -DOBJCOPY=... for ELF")
  endif()
  run(${OBJCOPY} --localize-symbols=${list_file} ${combined} ${OUTPUT})
else()
  message(FATAL_ERROR "private_symbols.cmake: unknown FORMAT '${FORMAT}' (MACHO or ELF)")
endif()
file(REMOVE ${combined})

global_symbols(${OUTPUT} left kept)
if(left)
  list(LENGTH left left_count)
  list(SUBLIST left 0 10 some)
  string(REPLACE ";" "\n  " some "${some}")
  file(REMOVE ${OUTPUT})
  message(FATAL_ERROR "private_symbols.cmake: ${left_count} symbols that are not rnncore's are "
                      "still global in ${OUTPUT}, e.g.\n  ${some}")
endif()
if(NOT "${kept}" STREQUAL "${own}")
  file(REMOVE ${OUTPUT})
  message(FATAL_ERROR "private_symbols.cmake: rnncore's own global symbols changed in "
                      "${OUTPUT}: before ${own}, after ${kept}")
endif()
list(LENGTH own own_count)
message(STATUS "${OUTPUT}: ${count} symbols made local, ${own_count} of rnncore's kept global")
